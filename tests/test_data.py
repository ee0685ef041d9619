"""Training data by global sample position (liver/data): a corpus prepared from local text files,
memory-mapped, whose samples and global batch do not depend on the data-parallel size; its
refusals; and a user's model learning from it."""

from __future__ import annotations

import dataclasses
import json
import sysconfig
from pathlib import Path

import pytest
import torch

from liver.cli import main
from liver.data import Tokens, batch
from liver.data.prepare import prepare
from liver.topology import JobConfig, ModelConfig, TrainConfig

ROOT = Path(__file__).resolve().parent.parent


def corpus(tmp_path: Path) -> Path:
    src = tmp_path / "text"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    (src / "sub" / "b.txt").write_text("pack my box with five dozen liquor jugs\n" * 40)
    return src


def test_a_prepared_corpus_is_the_files_bytes_in_order(tmp_path):
    src = corpus(tmp_path)
    meta = prepare([str(src)], tmp_path / "data")
    raw = (src / "a.txt").read_bytes() + (src / "sub" / "b.txt").read_bytes()
    assert meta["tokens"] == len(raw) and meta["file_count"] == 2 and meta["vocab_size"] == 256
    t = Tokens.open(tmp_path / "data")
    assert bytes(t.data.astype("u1")) == raw
    w = t.windows(5, 3, 17, seed=1)
    for row in w:  # each sample is a window of the corpus
        assert bytes(row.astype("u1").tolist()) in raw


@pytest.mark.parametrize("dp", [2, 3, 6])
def test_the_global_batch_is_the_same_for_any_data_parallel_size(tmp_path, dp):
    prepare([str(corpus(tmp_path))], tmp_path / "data")
    job = JobConfig(model=ModelConfig(num_layers=2, hidden_size=8, num_heads=2, ffn_size=8, vocab_size=256, seq_len=16),
                    train=TrainConfig(global_batch=6, data=str(tmp_path / "data")))
    whole = batch(job, 0, 1, 600)
    parts = [batch(job, r, dp, 600) for r in range(dp)]
    assert all(torch.equal(torch.cat([p[i] for p in parts]), whole[i]) for i in (0, 1))
    assert torch.equal(whole[0][:, 1:], whole[1][:, :-1])  # targets: the inputs shifted by one


def test_bad_data_is_refused_naming_the_field_or_the_path(tmp_path, capsys):
    with pytest.raises(ValueError, match="FILES: '.*nope' is neither a file nor a directory"):
        prepare([str(tmp_path / "nope")], tmp_path / "data")
    (tmp_path / "short.txt").write_text("too short")
    with pytest.raises(ValueError, match="9 bytes in all; at least 1,024 needed"):
        prepare([str(tmp_path / "short.txt")], tmp_path / "data")
    with pytest.raises(ValueError, match=r"train.data='.*empty': not a corpus made by `liver data prepare`"):
        (tmp_path / "empty").mkdir()
        TrainConfig(data=str(tmp_path / "empty"))
    assert main(["run", "--set", f"job.train.data={tmp_path / 'empty'}", "--run-dir", str(tmp_path / "r")]) == 2
    assert "train.data=" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_liver_data_prepare_and_a_users_model_learns_from_the_corpus(tmp_path, capsys):
    """The stdlib's own text (every machine has it): prepared by the CLI, then examples/llama.py's
    model trained on it in one process; its loss falls visibly."""
    from liver.config import jobfile
    from test_native import trained_alone

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [str(stdlib / n) for n in ("json/decoder.py", "json/encoder.py", "textwrap.py", "string.py")]
    assert main(["data", "prepare", *files, "--out", str(tmp_path / "data")]) == 0
    assert "tokens (bytes, vocabulary 256) from 4 files" in capsys.readouterr().out
    cfg = jobfile.load(ROOT / "configs" / "llama-native.toml", [{"job": {"train": {"data": str(tmp_path / "data")}}}])
    job = dataclasses.replace(cfg.job, train=dataclasses.replace(cfg.job.train, lr=3e-3, warmup_steps=2))
    losses = [x.loss for x in trained_alone(cfg.engine, job, 30)]
    assert json.loads((tmp_path / "data" / "meta.json").read_text())["sha256"][:16] == \
        Tokens.open(tmp_path / "data").fingerprint
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
