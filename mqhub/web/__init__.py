"""The admin web surface: JSON API, Prometheus /metrics and the static admin page (twisted.web)."""
