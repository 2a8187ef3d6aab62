"""The planner's predictions against measurement: run.py."""
