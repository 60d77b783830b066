"""Scheduling: pure interval and cron math, and the SchedulerService driven by an injected clock."""
