"""Schedules replace cron."""
