"""The daemon: control socket + auth, jobs per host, schedules, watch, metrics."""
