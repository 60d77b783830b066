"""VibeMQ: the binary frame protocol of the .NET VibeMQ.Client over the mqhub core."""
