"""The ring: its pure schedule and the collectives that follow it over a communicator."""
