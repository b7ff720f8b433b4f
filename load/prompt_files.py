"""Prompts from a user's file: JSONL, or a JSON array in the ShareGPT style.

Each record (a line of JSONL, an item of the array) is an object of one of three forms:

``{"prompt": TEXT, "max_tokens"?: N}``
    the prompt as it is;
``{"messages": [{"role": ..., "content": ...}, ...], "max_tokens"?: N}``
    an OpenAI chat request's messages: the **last user message** is the prompt (a system
    message and earlier turns are dropped, so every API of the load generator sends the same
    text); ``content`` is a string or a list of ``{"type": "text", "text": ...}`` parts;
``{"conversations": [{"from": "human"|"gpt", "value": ...}, ...]}``
    a ShareGPT conversation: the first human (or ``user``) turn is the prompt, and the
    length of the reply right after it (``gpt``, ``assistant``, ...) is ``max_tokens`` (in
    tokens with a tokenizer, else in words), as vLLM's ShareGPT dataset takes them.

Other keys (``id``) are ignored. A conversation without a human turn, or an empty prompt, is
skipped and counted. Anything else is a :class:`PromptFileError` naming the line.

Memory stays bounded: the file is read record by record (a JSON array too), a record may
not pass MAX_RECORD_CHARS, and the prompts kept may not pass MAX_KEPT_CHARS in all.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from .prompt_sets import ListedPrompts, Prompt
from .tokenizer import Tokenizer

MAX_RECORD_CHARS: Final = 64 * 1024 * 1024
MAX_KEPT_CHARS: Final = 1 << 30
READ_CHARS: Final = 1 << 20
COUNT_BATCH: Final = 1024
"""Records counted by the tokenizer in one call."""
HUMAN: Final = frozenset({"human", "user"})
NOT_A_REPLY: Final = HUMAN | {"system"}
_WHITESPACE: Final = " \t\r\n"
_NOT_WHITESPACE: Final = re.compile(r"[^ \t\r\n]")


class PromptFileError(ValueError):
    """A prompt file that cannot be read; ``line`` is where (1-based), 0 for the whole file."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")
        self.path = path
        self.line = line


@dataclass(frozen=True, slots=True, kw_only=True)
class _Record:
    text: str
    reply: str | None
    max_tokens: int | None


def read_prompts(path: Path, *, name: str, tokenizer: Tokenizer | None = None) -> ListedPrompts:
    """The prompts of the file at ``path``, as a set named ``name``."""
    try:
        file = path.open(encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise PromptFileError(path, 0, exc.strerror or str(exc)) from None
    prompts: list[Prompt] = []
    batch: list[_Record] = []
    skipped = 0
    kept_chars = 0
    with file, read_errors(path):
        for line, item in file_records(file, path):
            record = _record(item, path, line)
            if record is None:
                skipped += 1
                continue
            kept_chars += len(record.text)
            if kept_chars > MAX_KEPT_CHARS:
                raise PromptFileError(
                    path, line, f"the prompts pass {MAX_KEPT_CHARS} characters; use a smaller file"
                )
            batch.append(record)
            if len(batch) == COUNT_BATCH:
                prompts += _counted(batch, tokenizer)
                batch = []
    prompts += _counted(batch, tokenizer)
    if not prompts:
        raise PromptFileError(path, 0, f"no prompts ({skipped} records skipped)")
    return ListedPrompts(
        name=name,
        prompts=tuple(prompts),
        input_tokens_counted_by="tokenizer" if tokenizer else "none",
        skipped=skipped,
    )


@contextlib.contextmanager
def read_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:  # a read that failed, a pipe that cannot seek back
        raise PromptFileError(path, 0, f"cannot be read: {exc}") from None


def _counted(batch: list[_Record], tokenizer: Tokenizer | None) -> list[Prompt]:
    if tokenizer is None:
        return [Prompt(text=r.text, input_tokens=None, max_tokens=_reply_words(r)) for r in batch]
    replies = [r.reply for r in batch if r.reply is not None]
    reply_counts = iter(tokenizer.count_batch(replies))
    input_counts = tokenizer.count_batch([r.text for r in batch])
    prompts = []
    for record, n in zip(batch, input_counts, strict=True):
        max_tokens = record.max_tokens
        if record.reply is not None:
            max_tokens = next(reply_counts) or None
        prompts.append(
            Prompt(text=record.text, input_tokens=n, max_tokens=max_tokens, input_tokens_exact=True)
        )
    return prompts


def _reply_words(record: _Record) -> int | None:
    if record.reply is None:
        return record.max_tokens
    return len(record.reply.split()) or None


def file_records(file: IO[str], path: Path) -> Iterator[tuple[int, object]]:
    """(line, parsed record) for each record: of a JSON array if the file starts with ``[``,
    else of each non-blank line."""
    try:
        first = ""
        while not first and (more := file.read(READ_CHARS)):
            first = more.lstrip(_WHITESPACE)[:1]
        file.seek(0)
        if first == "[":
            yield from _array_items(file, path)
        else:
            yield from _lines(file, path)
    except UnicodeDecodeError as exc:
        raise PromptFileError(path, 0, f"not UTF-8 text ({exc.reason})") from None


def _lines(file: IO[str], path: Path) -> Iterator[tuple[int, object]]:
    for line, text in enumerate(iter(lambda: file.readline(MAX_RECORD_CHARS + 1), ""), 1):
        if len(text) > MAX_RECORD_CHARS:
            raise PromptFileError(path, line, f"a line longer than {MAX_RECORD_CHARS} characters")
        if text.strip(_WHITESPACE):
            try:
                yield line, json.loads(text)
            except json.JSONDecodeError as exc:
                raise PromptFileError(path, line, f"not JSON: {exc.msg}") from None


def _array_items(file: IO[str], path: Path) -> Iterator[tuple[int, object]]:
    """The items of a top-level JSON array, parsed one at a time as the file is read."""
    decoder = json.JSONDecoder()
    buffer = ""
    position = 0
    line = 1
    expect_comma = False
    at_end = False

    def fill(wanted: int) -> bool:
        nonlocal buffer, position, at_end
        buffer = buffer[position:]
        position = 0
        more = file.read(max(READ_CHARS, wanted))
        at_end = not more
        buffer += more
        return bool(more)

    def skip_whitespace() -> None:
        nonlocal position, line
        while True:
            found = _NOT_WHITESPACE.search(buffer, position)
            stripped = len(buffer) if found is None else found.start()
            line += buffer.count("\n", position, stripped)
            position = stripped
            if position < len(buffer) or not fill(READ_CHARS):
                return

    skip_whitespace()
    position += 1  # the "[" that file_records found
    while True:
        skip_whitespace()
        if position == len(buffer):
            raise PromptFileError(path, line, "the JSON array is not closed")
        if buffer[position] == "]":
            position += 1
            skip_whitespace()
            if position < len(buffer):
                raise PromptFileError(path, line, "text after the JSON array")
            return
        if expect_comma:
            if buffer[position] != ",":
                raise PromptFileError(path, line, "expected ',' or ']' between array items")
            position += 1
            expect_comma = False
            continue
        if buffer[position] != "{":
            raise PromptFileError(path, line, "an array item that is not an object")
        while True:
            try:
                item, end = decoder.raw_decode(buffer, position)
                break
            except json.JSONDecodeError as exc:
                if len(buffer) - position > MAX_RECORD_CHARS:
                    raise PromptFileError(
                        path, line, f"an item longer than {MAX_RECORD_CHARS} characters"
                    ) from None
                # an item cut by the end of what was read: read more (as much again, so a
                # large item is parsed a few times, not once per chunk)
                if at_end or not fill(len(buffer) - position):
                    raise PromptFileError(path, line, f"not JSON: {exc.msg}") from None
        yield line, item
        line += buffer.count("\n", position, end)
        position = end
        expect_comma = True


def _record(item: object, path: Path, line: int) -> _Record | None:
    if not isinstance(item, dict):
        raise PromptFileError(path, line, "a record that is not a JSON object")
    forms = [key for key in ("prompt", "messages", "conversations") if key in item]
    if len(forms) != 1:
        raise PromptFileError(
            path,
            line,
            "a record needs exactly one of 'prompt', 'messages', 'conversations'"
            + (f" (it has {', '.join(forms)})" if forms else ""),
        )
    max_tokens = _max_tokens(item, path, line)
    if forms == ["prompt"]:
        text = string_field(item["prompt"], "'prompt'", path, line)
        reply = None
    elif forms == ["messages"]:
        text, reply = _last_user_message(item["messages"], path, line), None
    else:
        if max_tokens is not None:
            raise PromptFileError(path, line, "a conversation's max_tokens is its reply's length")
        text, reply = _conversation(item["conversations"], path, line)
    if not text.strip():
        return None
    return _Record(text=text, reply=reply, max_tokens=max_tokens)


def _max_tokens(item: dict[str, Any], path: Path, line: int) -> int | None:
    value = item.get("max_tokens")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PromptFileError(path, line, f"'max_tokens' is {value!r}, not a positive integer")
    return value


def string_field(value: object, what: str, path: Path, line: int) -> str:
    if not isinstance(value, str):
        raise PromptFileError(path, line, f"{what} is {type(value).__name__}, not a string")
    return value


def _last_user_message(messages: object, path: Path, line: int) -> str:
    if not isinstance(messages, list):
        raise PromptFileError(path, line, "'messages' is not a list")
    for message in messages:
        if not isinstance(message, dict):
            raise PromptFileError(path, line, "a message that is not an object")
        string_field(message.get("role"), "a message's 'role'", path, line)
    users = [m for m in messages if m["role"] == "user"]
    if not users:
        raise PromptFileError(path, line, "'messages' has no user message")
    content = users[-1].get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise PromptFileError(path, line, "a content part that is not {'type': 'text'}")
            parts.append(string_field(part.get("text"), "a text part's 'text'", path, line))
        return "\n".join(parts)
    return string_field(content, "the user message's 'content'", path, line)


def _conversation(turns: object, path: Path, line: int) -> tuple[str, str | None]:
    if not isinstance(turns, list):
        raise PromptFileError(path, line, "'conversations' is not a list")
    speakers: list[str] = []
    values: list[str] = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise PromptFileError(path, line, "a turn that is not an object")
        speakers.append(string_field(turn.get("from"), "a turn's 'from'", path, line))
        values.append(string_field(turn.get("value"), "a turn's 'value'", path, line))
    first = next((i for i, who in enumerate(speakers) if who in HUMAN), None)
    if first is None:
        return "", None
    replied = first + 1 < len(speakers) and speakers[first + 1] not in NOT_A_REPLY
    return values[first], values[first + 1] if replied else None
