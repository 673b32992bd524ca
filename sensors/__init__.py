"""Sensors replace file watchers."""
