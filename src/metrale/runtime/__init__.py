"""Where a rollout's commands run: the `Runtime` protocol and its implementations."""

from metrale.runtime.base import ProgramResult, Runtime, RuntimeConfig

__all__ = ["ProgramResult", "Runtime", "RuntimeConfig"]
