"""The load generator's prompts: length distributions, synthetic prompts (with and without a
tokenizer), the bundled set, users' files (good and bad), and the command-line options."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferwire._runtime.arguments import CommandError, Parser
from inferwire.load import prompt_files, prompts
from inferwire.load.prompt_sets import (
    MAX_LENGTH_TOKENS,
    PREFIX_SEPARATOR,
    WORDS,
    ListedPrompts,
    SyntheticPrompts,
    WithSharedPrefix,
)
from inferwire.load.prompts import Lengths, LengthsError, Prompt, PromptFileError
from inferwire.load.tokenizer import Tokenizer, TokenizerError, load_tokenizer
from inferwire.workloads import vocab

BUNDLED = Path(prompts.__file__).parent / "data" / prompts.BUNDLED_FILE

# -- tokenizers made here, from the project's vocabulary ------------------------------------


def _corpus() -> list[str]:
    words = [p.strip() for p in vocab.pieces() if p.strip()]
    rng = np.random.default_rng(7)
    return [" ".join(rng.choice(words, size=24).tolist()) for _ in range(300)]


def _byte_level_bpe() -> Any:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = HfTokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["[UNK]", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    return tokenizer


def _word_level() -> Any:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    tokenizer = HfTokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.train_from_iterator(_corpus(), trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    return tokenizer


@pytest.fixture(scope="module", params=["bpe", "wordlevel"])
def tokenizer(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Tokenizer:
    made = _byte_level_bpe() if request.param == "bpe" else _word_level()
    directory = tmp_path_factory.mktemp(request.param)
    made.save(str(directory / "tokenizer.json"))
    return load_tokenizer(directory)


# -- lengths ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "first", "second"),
    [
        ("256", "fixed", 256, 0),
        (" 1 ", "fixed", 1, 0),
        ("uniform:64,256", "uniform", 64, 256),
        ("uniform:8,8", "uniform", 8, 8),
        ("normal:256,32", "normal", 256, 32),
        ("lognormal:300,0.5", "lognormal", 300, 0.5),
        ("normal:1048576,0.123456789", "normal", MAX_LENGTH_TOKENS, 0.123456789),
    ],
)
def test_lengths_parse(text: str, kind: str, first: float, second: float) -> None:
    lengths = Lengths.parse(text)
    assert (lengths.kind, lengths.first, lengths.second) == (kind, first, second)
    assert Lengths.parse(str(lengths)) == lengths


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not a whole number"),
        ("0", "not 1 to"),
        ("-5", "not 1 to"),
        (str(MAX_LENGTH_TOKENS + 1), "not 1 to"),
        ("2.5", "not a whole number"),
        ("many", "not a whole number"),
        ("poisson:3,4", "unknown distribution 'poisson'"),
        ("uniform:5", "two numbers"),
        ("uniform:5,6,7", "two numbers"),
        ("uniform:9,3", "LOW is above HIGH"),
        ("uniform:0,3", "not 1 to"),
        ("uniform:1.5,3", "not a whole number"),
        ("normal:0.5,3", "not 1 to"),
        ("normal:256,-1", "negative"),
        ("normal:1e400,3", "not a finite number"),
        ("lognormal:256,nan", "not a finite number"),
        ("normal:1-2,3", "not a number"),
    ],
)
def test_bad_lengths_say_why(text: str, reason: str) -> None:
    with pytest.raises(LengthsError, match=reason) as raised:
        Lengths.parse(text)
    assert isinstance(raised.value, ValueError)
    assert repr(text) in str(raised.value)


def test_lengths_draws_keep_their_distribution() -> None:
    rng = np.random.default_rng(3)
    uniform = Lengths.parse("uniform:10,20").draw(rng, 20_000)
    assert uniform.min() == 10
    assert uniform.max() == 20  # both ends included
    normal = Lengths.parse("normal:256,32").draw(rng, 20_000)
    assert abs(normal.mean() - 256) < 2
    assert abs(normal.std() - 32) < 2
    clipped = Lengths.parse("normal:2,50").draw(rng, 20_000)
    assert clipped.min() == 1
    lognormal = Lengths.parse("lognormal:300,0.5").draw(rng, 20_000)
    assert abs(np.median(lognormal) - 300) < 10
    assert lognormal.dtype == np.int64
    assert (Lengths.parse("64").draw(rng, 5) == 64).all()


# -- synthetic prompts ------------------------------------------------------------------------


def test_synthetic_prompts_without_a_tokenizer_are_words() -> None:
    prompt_set = prompts.synthetic(Lengths.parse("uniform:5,50"), Lengths.parse("128"))
    drawn = prompt_set.draw(500, seed=1)
    assert len(drawn) == 500
    assert prompt_set.name == "synthetic(input=uniform:5,50; output=128)"
    assert prompt_set.input_tokens_counted_by == "words"
    known = set(WORDS)
    for prompt in drawn:
        words = prompt.text.split(" ")
        assert len(words) == prompt.input_tokens
        assert 5 <= len(words) <= 50
        assert set(words) <= known
        assert prompt.max_tokens == 128
        assert not prompt.input_tokens_exact
    assert len({p.input_tokens for p in drawn}) > 30  # the lengths vary


def test_synthetic_prompts_are_seeded_and_differ_at_the_start() -> None:
    prompt_set = prompts.synthetic(Lengths.parse("64"), None)
    first = prompt_set.draw(2000, seed=5)
    assert first == prompt_set.draw(2000, seed=5)
    assert first != prompt_set.draw(2000, seed=6)
    assert all(p.max_tokens is None for p in first)
    # no two share their first 16 words (a prefix-cache block): each is new to the server
    assert len({" ".join(p.text.split()[:16]) for p in first}) == len(first)
    assert prompt_set.draw(0, seed=5) == []
    with pytest.raises(ValueError, match="cannot draw -1"):
        prompt_set.draw(-1, seed=5)
    huge = prompts.synthetic(Lengths.parse(str(MAX_LENGTH_TOKENS)), None)
    with pytest.raises(ValueError, match="draw fewer at a time"):
        huge.draw(1000, seed=5)  # refused before any text is made


@pytest.mark.parametrize("spec", ["1", "64", "256", "uniform:1,300"])
def test_synthetic_prompts_with_a_tokenizer_have_exactly_their_length(
    tokenizer: Tokenizer, spec: str
) -> None:
    prompt_set = prompts.synthetic(Lengths.parse(spec), None, tokenizer=tokenizer)
    assert prompt_set.input_tokens_counted_by == "tokenizer"
    wanted = Lengths.parse(spec).draw(np.random.default_rng(11), 200).tolist()
    drawn = prompt_set.draw(200, seed=11)
    counted = tokenizer.count_batch([p.text for p in drawn])
    assert [p.input_tokens for p in drawn] == counted
    assert all(p.input_tokens_exact for p in drawn)
    # the draw converges for all but a few: never farther than a token or two
    assert sum(c == w for c, w in zip(counted, wanted, strict=True)) >= 195
    assert max(abs(c - w) for c, w in zip(counted, wanted, strict=True)) <= 2
    assert drawn == prompt_set.draw(200, seed=11)
    if spec != "1":
        assert len({p.text[:20] for p in drawn}) == len(drawn)


def test_synthetic_prompts_never_hold_special_tokens(tokenizer: Tokenizer) -> None:
    drawn = prompts.synthetic(Lengths.parse("128"), None, tokenizer=tokenizer).draw(50, seed=2)
    for prompt in drawn:
        assert not set(tokenizer.encode(prompt.text)) & tokenizer.special_ids
        assert "\ufffd" not in prompt.text


# -- the tokenizer ----------------------------------------------------------------------------


def test_a_tokenizer_loads_from_its_file_or_directory(tokenizer: Tokenizer) -> None:
    again = load_tokenizer(tokenizer.path)
    assert again.path == tokenizer.path
    assert tokenizer.path.name == "tokenizer.json"
    text = "the model and the server"
    ids = tokenizer.encode(text)
    assert tokenizer.count(text) == len(ids) > 0
    assert again.encode(text) == ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.count_batch([text, "the"]) == [len(ids), tokenizer.count("the")]
    assert tokenizer.decode_batch([ids]) == [text]


def test_a_bad_tokenizer_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="never downloaded"):
        load_tokenizer("gpt2")  # a hub name: not looked up
    with pytest.raises(TokenizerError, match=r"directory without a tokenizer\.json"):
        load_tokenizer(tmp_path)
    broken = tmp_path / "tokenizer.json"
    broken.write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(TokenizerError, match="not a tokenizer the tokenizers library reads"):
        load_tokenizer(tmp_path)


def test_without_the_library_the_tokenizer_names_its_extra(tmp_path: Path) -> None:
    code = (
        "import sys\nsys.modules['tokenizers'] = None\n"
        "from inferwire.load.tokenizer import load_tokenizer\n"
        f"load_tokenizer({str(tmp_path)!r})\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.stderr.splitlines()[-1] == (
        "inferwire._runtime.extras.MissingExtraError: counting tokens with --tokenizer needs "
        "tokenizers, which is not installed: pip install 'inferwire[tokenizer]'"
    )


# -- users' files -----------------------------------------------------------------------------


def _jsonl(path: Path, *records: Any) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


RECORDS: list[Any] = [
    {"prompt": "plain prompt"},
    {"prompt": "with its own length", "max_tokens": 7},
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
    {
        "messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        "max_tokens": 3,
    },
    {
        "id": "x",
        "conversations": [
            {"from": "system", "value": "sys"},
            {"from": "human", "value": "question one"},
            {"from": "gpt", "value": "an answer of six words here"},
            {"from": "human", "value": "later"},
        ],
    },
    {"conversations": [{"from": "human", "value": "unanswered"}]},
    {"conversations": [{"from": "gpt", "value": "no human turn"}]},  # skipped
    {"prompt": "   "},  # skipped
]
EXPECTED = [
    ("plain prompt", None),
    ("with its own length", 7),
    ("hi", None),
    ("a\nb", 3),
    ("question one", 6),
    ("unanswered", None),
]


def test_a_jsonl_file_of_every_form(tmp_path: Path) -> None:
    prompt_set = prompts.from_file(_jsonl(tmp_path / "p.jsonl", *RECORDS))
    assert isinstance(prompt_set, ListedPrompts)
    assert prompt_set.name == f"file:{tmp_path / 'p.jsonl'}"
    assert [(p.text, p.max_tokens) for p in prompt_set.prompts] == EXPECTED
    assert all(p.input_tokens is None for p in prompt_set.prompts)
    assert prompt_set.input_tokens_counted_by == "none"
    assert prompt_set.skipped == 2


@pytest.mark.parametrize("read_chars", [1, 7, 64, 1 << 20])
def test_a_sharegpt_json_array_is_read_item_by_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_chars: int
) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_text("\ufeff \n" + json.dumps(RECORDS, indent=2))
    monkeypatch.setattr(prompt_files, "READ_CHARS", read_chars)
    prompt_set = prompts.from_file(path)
    assert isinstance(prompt_set, ListedPrompts)
    assert [(p.text, p.max_tokens) for p in prompt_set.prompts] == EXPECTED
    assert prompt_set.skipped == 2


def test_a_tokenizer_counts_a_file_prompts_and_replies(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    path = _jsonl(tmp_path / "p.jsonl", *RECORDS)
    prompt_set = prompts.from_file(path, tokenizer=tokenizer)
    assert isinstance(prompt_set, ListedPrompts)
    assert prompt_set.input_tokens_counted_by == "tokenizer"
    by_text = {p.text: p for p in prompt_set.prompts}
    assert all(p.input_tokens == tokenizer.count(t) for t, p in by_text.items())
    assert by_text["question one"].max_tokens == tokenizer.count("an answer of six words here")
    assert by_text["with its own length"].max_tokens == 7


def test_listed_prompts_are_drawn_in_seeded_shuffles(tmp_path: Path) -> None:
    prompt_set = prompts.from_file(_jsonl(tmp_path / "p.jsonl", *RECORDS))
    drawn = prompt_set.draw(20, seed=4)
    assert drawn == prompt_set.draw(20, seed=4)
    assert drawn != prompt_set.draw(20, seed=5)
    texts = [p.text for p in drawn]
    # each pass over the six prompts is a permutation of them
    for start in (0, 6, 12):
        assert sorted(texts[start : start + 6]) == sorted(t for t, _ in EXPECTED)
    assert Counter(texts[18:]).most_common(1)[0][1] == 1


BAD_FILES = [
    ("[1, 2]", 1, "not an object"),
    ('{"prompt": "a"}\n\n{"prompt": \n', 3, "not JSON"),
    ('{"prompt": "a"}\n[1]\n', 2, "not a JSON object"),
    ('{"prompt": "a", "messages": []}', 1, "exactly one of"),
    ('{"text": "a"}', 1, "exactly one of"),
    ('{"prompt": 5}', 1, "'prompt' is int, not a string"),
    ('{"prompt": "a", "max_tokens": 0}', 1, "not a positive integer"),
    ('{"prompt": "a", "max_tokens": "5"}', 1, "not a positive integer"),
    ('{"prompt": "a", "max_tokens": true}', 1, "not a positive integer"),
    ('{"messages": {"role": "user"}}', 1, "'messages' is not a list"),
    ('{"messages": ["hi"]}', 1, "a message that is not an object"),
    ('{"messages": [{"content": "hi"}]}', 1, "a message's 'role' is NoneType"),
    ('{"messages": [{"role": "system", "content": "hi"}]}', 1, "no user message"),
    ('{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 1, "content part"),
    ('{"messages": [{"role": "user"}]}', 1, "'content' is NoneType"),
    ('{"conversations": "hi"}', 1, "'conversations' is not a list"),
    ('{"conversations": [{"from": "human", "value": 3}]}', 1, "'value' is int"),
    ('{"conversations": [{"value": "x"}]}', 1, "'from' is NoneType"),
    ('{"conversations": [], "max_tokens": 4}', 1, "max_tokens is its reply's length"),
    ('[\n  {"prompt": "a"},\n  {"prompt": "b"}\n', 4, "not closed"),
    ('[\n  {"prompt": "a"}\n  {"prompt": "b"}\n]', 3, "expected ','"),
    ('[\n  {"prompt": "a"},\n  {"prompt": \n', 3, "not JSON"),
    ('[{"prompt": "a"}] x', 1, "text after the JSON array"),
    ('[\n\n  {"prompt": "a"},\n  "b"]', 4, "not an object"),
    ("", 0, "no prompts (0 records skipped)"),
    ('{"prompt": ""}\n{"conversations": []}\n', 0, "no prompts (2 records skipped)"),
    ("[]", 0, "no prompts"),
]


@pytest.mark.parametrize(("content", "line", "reason"), BAD_FILES)
@pytest.mark.parametrize("read_chars", [3, 1 << 20])
def test_a_bad_file_names_its_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    content: str,
    line: int,
    reason: str,
    read_chars: int,
) -> None:
    monkeypatch.setattr(prompt_files, "READ_CHARS", read_chars)
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(PromptFileError, match=re.escape(reason)) as raised:
        prompts.from_file(path)
    assert raised.value.line == line
    assert str(raised.value).startswith(f"{path}:{line}: " if line else f"{path}: ")


def test_files_that_cannot_be_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PromptFileError, match="No such file"):
        prompts.from_file(tmp_path / "missing.jsonl")
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(PromptFileError, match="not UTF-8"):
        prompts.from_file(latin1)
    with pytest.raises(PromptFileError, match="Is a directory"):
        prompts.from_file(tmp_path)
    monkeypatch.setattr(prompt_files, "MAX_RECORD_CHARS", 100)
    long_line = _jsonl(tmp_path / "long.jsonl", {"prompt": "a"}, {"prompt": "b" * 200})
    with pytest.raises(PromptFileError, match="a line longer than 100") as raised:
        prompts.from_file(long_line)
    assert raised.value.line == 2
    long_item = tmp_path / "long.json"
    long_item.write_text(json.dumps([{"prompt": "a"}, {"prompt": "b" * 200}]))
    monkeypatch.setattr(prompt_files, "READ_CHARS", 16)
    with pytest.raises(PromptFileError, match="an item longer than 100"):
        prompts.from_file(long_item)
    monkeypatch.setattr(prompt_files, "MAX_KEPT_CHARS", 150)
    many = _jsonl(tmp_path / "many.jsonl", *({"prompt": "x" * 60} for _ in range(3)))
    with pytest.raises(PromptFileError, match="the prompts pass 150 characters") as raised:
        prompts.from_file(many)
    assert raised.value.line == 3


# -- the bundled set --------------------------------------------------------------------------


def test_the_bundled_file_is_what_the_generator_writes(tmp_path: Path) -> None:
    assert BUNDLED.read_bytes() == prompts.bundled_bytes(), (
        "the bundled prompts are stale: python -m inferwire.load.prompts write-bundled"
    )
    written = tmp_path / "again.jsonl"
    assert prompts.main(["write-bundled", "--output", str(written)]) == 0
    assert written.read_bytes() == BUNDLED.read_bytes()


def test_the_bundled_set_has_varied_chat_prompts() -> None:
    prompt_set = prompts.bundled()
    assert isinstance(prompt_set, ListedPrompts)
    assert prompt_set.name == "bundled"
    assert len(prompt_set.prompts) == prompts.BUNDLED_COUNT
    assert len({p.text for p in prompt_set.prompts}) == prompts.BUNDLED_COUNT
    words = sorted(len(p.text.split()) for p in prompt_set.prompts)
    assert words[0] < 12
    assert words[-1] > 600
    assert all(p.max_tokens is not None and p.max_tokens >= 1 for p in prompt_set.prompts)


# -- command line -----------------------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    parser = Parser(prog="load")
    prompts.add_prompt_arguments(parser.add_argument_group("prompts"))
    return parser.parse_args(argv)


def test_the_default_is_synthetic_256_tokens() -> None:
    prompt_set = prompts.prompt_set_from_args(_args())
    assert prompt_set.name == "synthetic(input=256; output=none)"
    (prompt,) = prompt_set.draw(1, seed=0)
    assert prompt.input_tokens == 256
    assert prompt.max_tokens is None


def test_the_options_choose_the_set(tmp_path: Path, tokenizer: Tokenizer) -> None:
    chosen = prompts.prompt_set_from_args(
        _args("--input-tokens", "uniform:8,16", "--output-tokens", "normal:64,8",
              "--tokenizer", str(tokenizer.path.parent))
    )  # fmt: skip
    assert chosen.name == (
        f"synthetic(input=uniform:8,16; output=normal:64,8; tokenizer={tokenizer.path})"
    )
    assert all(8 <= p.input_tokens <= 16 for p in chosen.draw(20, seed=1) if p.input_tokens)
    capped = prompts.prompt_set_from_args(_args("--prompts", "bundled", "--output-tokens", "16"))
    assert capped.name == "bundled; output=16"
    base = prompts.bundled().draw(40, seed=3)
    drawn = capped.draw(40, seed=3)
    assert [p.text for p in drawn] == [p.text for p in base]
    assert {p.max_tokens for p in drawn} == {16}
    path = _jsonl(tmp_path / "p.jsonl", {"prompt": "hello"})
    from_file = prompts.prompt_set_from_args(_args("--prompts", str(path)))
    assert (
        from_file.draw(2, seed=0) == [Prompt(text="hello", input_tokens=None, max_tokens=None)] * 2
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompts", "bundled", "--input-tokens", "5"], "--input-tokens sets synthetic"),
        (["--prompts", "nowhere.jsonl"], "--prompts: nowhere.jsonl does not exist"),
        (["--prompts", "."], "--prompts: . is a directory"),
        (["--tokenizer", "gpt2"], "--tokenizer: gpt2 does not exist"),
    ],
)
def test_bad_options_are_command_errors(argv: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        prompts.prompt_set_from_args(_args(*argv))


def test_the_tokenizer_option_loads_once(tokenizer: Tokenizer) -> None:
    args = _args("--tokenizer", str(tokenizer.path))
    loaded = prompts.tokenizer_from_args(args)
    assert loaded is not None
    assert loaded.path == tokenizer.path
    assert prompts.tokenizer_from_args(_args()) is None
    chosen = prompts.prompt_set_from_args(args, tokenizer=loaded)
    assert isinstance(chosen, SyntheticPrompts)
    assert chosen.tokenizer is loaded


def test_a_bad_file_is_a_command_error_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": 1}\n')
    with pytest.raises(CommandError, match=rf"^--prompts: {path}:2: 'prompt' is int"):
        prompts.prompt_set_from_args(_args("--prompts", str(path)))


def test_bad_lengths_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        _args("--input-tokens", "uniform:9,3")
    assert raised.value.code == 2
    assert "argument --input-tokens: 'uniform:9,3': LOW is above HIGH" in capsys.readouterr().err


# -- shared prefixes ----------------------------------------------------------------------------


def test_shared_prefixes_with_a_tokenizer_lead_with_the_same_tokens(tokenizer: Tokenizer) -> None:
    base = prompts.synthetic(Lengths.parse("16"), None, tokenizer=tokenizer)
    shared = WithSharedPrefix(base=base, prefix_tokens=24, groups=2, tokenizer=tokenizer)
    drawn = shared.draw(6, seed=5)
    assert [p.text.split(PREFIX_SEPARATOR, 1)[1] for p in drawn] == [
        p.text for p in base.draw(6, seed=5)
    ]
    prefix_ids = tokenizer.encode_batch(shared.prefixes(seed=5))
    assert all(abs(len(ids) - 24) <= 2 for ids in prefix_ids)  # as synthetic prompts converge
    for i, prompt in enumerate(drawn):
        ids = tokenizer.encode(prompt.text)
        assert ids[: len(prefix_ids[i % 2])] == prefix_ids[i % 2]  # the join merges nothing
        assert prompt.input_tokens == len(ids)
        assert prompt.input_tokens_exact


def test_the_prefix_options_wrap_any_set(tmp_path: Path) -> None:
    chosen = prompts.prompt_set_from_args(
        _args("--prompts", "bundled", "--prefix-tokens", "8", "--prefix-groups", "3")
    )
    assert isinstance(chosen, WithSharedPrefix)
    assert chosen.name == "bundled; prefix=8x3"
    words = [p.text.split() for p in chosen.draw(6, seed=2)]
    assert words[0][:8] == words[3][:8] != words[1][:8]
    one = prompts.prompt_set_from_args(_args("--prefix-tokens", "4", "--input-tokens", "2"))
    assert [p.input_tokens for p in one.draw(3, seed=0)] == [6, 6, 6]
    with pytest.raises(CommandError, match="--prefix-groups goes with --prefix-tokens"):
        prompts.prompt_set_from_args(_args("--prefix-groups", "2"))


@pytest.mark.parametrize("argv", [["--prefix-tokens", "0"], ["--prefix-groups", "x"]])
def test_bad_prefix_options_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _args(*argv)
    assert argv[0] in capsys.readouterr().err
