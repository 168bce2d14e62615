"""Local emulators of remote sandbox services (`metrale sandbox-sim`): the official SDKs,
unmodified, talk to them over the wire, with real sandboxes behind."""
