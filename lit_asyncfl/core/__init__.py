"""The simulation engine: virtual clock, flat weights, client jobs and updates, the server, the event loop."""
