"""Replay files: parsing, which turn a request gets, and the streamed shape the client reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metrale.endpoint.replay import load_replay, stream_deltas, turn_for
from metrale.errors import UsageError


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_turns_are_keyed_by_assistant_messages_and_the_last_repeats(tmp_path: Path) -> None:
    turns = load_replay(write(
        tmp_path,
        "# a comment",
        '{"content": "one", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}',
        "",
        '{"content": "two"}',
    ))  # fmt: skip
    assert len(turns) == 2
    user = {"role": "user", "content": "x"}
    assistant = {"role": "assistant", "content": "y"}
    assert turn_for(turns, [user])[0] == 0
    assert turn_for(turns, [user, assistant, user])[0] == 1
    assert turn_for(turns, [user, assistant, user, assistant, user])[0] == 1
    first = turns[0]
    assert first.finish() == "tool_calls" and turns[1].finish() == "stop"
    assert json.loads(first.tool_calls[0].arguments) == {"command": "ls"}


def test_raw_string_arguments_are_sent_verbatim(tmp_path: Path) -> None:
    turns = load_replay(write(tmp_path, json.dumps(
        {"tool_calls": [{"name": "bash", "arguments": '{"command": "ls"'}]}
    )))  # fmt: skip
    deltas = stream_deltas(turns[0], 0)
    assert deltas[-1]["tool_calls"][0]["function"]["arguments"] == '{"command": "ls"'
    assert deltas[-2]["tool_calls"][0]["id"] == "call_replay_0_0"


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "has no turns"), ("not json", "line 1"), ('{"tool_calls": 3}', "line 1")],
)
def test_bad_files_are_one_line_usage_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_replay(write(tmp_path, text))
    with pytest.raises(UsageError, match="does not exist"):
        load_replay(tmp_path / "missing.jsonl")
