"""Talking to the target: the measuring client, the probe and preflight, the local llama.cpp
launcher, and the simulator server."""

from metrale.endpoint.client import CallRecord, ChatClient, ClientOptions, EndpointError, Target

__all__ = ["CallRecord", "ChatClient", "ClientOptions", "EndpointError", "Target"]
