"""Measuring clients for the lab's transports, and the SSE parser they share."""
