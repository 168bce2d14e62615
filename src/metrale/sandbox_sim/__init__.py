"""Local emulators of remote sandbox services (`metrale sandbox-sim`): the official SDK talks
to them over the service's own wire protocol, and real sandboxes (`backend`) run behind them.
`faults` injects what the real services do under load; `server` is what every emulator shares.
"""
