"""The offline tokenizer the guidellm comparison hands to guidellm
(inferwire.load.local_tokenizer): lossless, deterministic, one token per word piece."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferwire.load import local_tokenizer
from inferwire.workloads import token_stream_source
from inferwire.workloads.vocab import pieces

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    local_tokenizer.write(directory)
    return directory


def test_writes_the_three_files_transformers_reads(built: Path) -> None:
    assert sorted(p.name for p in built.iterdir()) == sorted(local_tokenizer.FILES)
    config = json.loads((built / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["eos_token"] == local_tokenizer.EOS_TOKEN
    special = json.loads((built / "special_tokens_map.json").read_text())
    assert special == {"bos_token": config["bos_token"], "eos_token": config["eos_token"]}


def test_round_trips_any_text(built: Path) -> None:
    tokenizer = tokenizers.Tokenizer.from_file(str(built / "tokenizer.json"))
    texts = [
        "It is a truth universally acknowledged, that a single man in possession",
        "naïve résumé — 東京 😊 °C\n\n\tZürich",
        "".join(chunk.text for chunk in token_stream_source("stream-256", 7)),
        "\x00\x7f bytes the vocabulary never saw: ∮ \U0001d518",
    ]
    for text in texts:
        ids = tokenizer.encode(text).ids
        assert ids
        assert tokenizer.decode(ids) == text


def test_each_word_piece_is_one_token(built: Path) -> None:
    tokenizer = tokenizers.Tokenizer.from_file(str(built / "tokenizer.json"))
    split = {p for p in pieces() if len(tokenizer.encode(p).ids) != 1}
    # the byte-level pre-tokenizer parts punctuation from letters before BPE sees them
    assert split == {"\u2019s", "°C"}


def test_same_vocabulary_same_file(built: Path) -> None:
    assert local_tokenizer.build_json() == (built / "tokenizer.json").read_text()


def test_command_line_writes_and_refuses_a_file(tmp_path: Path) -> None:
    out = tmp_path / "tok"
    done = subprocess.run(
        [sys.executable, "-m", "inferwire.load.local_tokenizer", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (out / "tokenizer.json").is_file()
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(local_tokenizer.TokenizerError, match="not a directory"):
        local_tokenizer.write(not_a_dir)
    assert local_tokenizer.main([str(not_a_dir)]) == 2
