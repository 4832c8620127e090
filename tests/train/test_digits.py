"""The digits task writer (dohnuts/train/digits.py): counts, stratification, pixels, parsing, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from PIL import Image

from dohnuts.errors import DohnutsError
from dohnuts.runtime.requests import Request, read_requests
from dohnuts.train import digits

SPLITS = ("train", "dev", "calib", "test")
CLASS_COUNTS = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]  # sklearn's digits, 1797 in all


@pytest.fixture(scope="module")
def sk():
    """scikit-learn's digits, imported here rather than at collection, where every test process would."""
    d = pytest.importorskip("sklearn.datasets").load_digits()
    return d.images, d.target


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    return out, digits.write_digits(out)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    pytest.importorskip("sklearn")  # the writer reads scikit-learn's digits (test_cli_without_sklearn: without it)
    out = tmp_path_factory.mktemp("small")
    return out, digits.write_digits(out, seed=0, limit=100)


def _lines(out: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (out / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]


def _index(rec: dict) -> int:
    assert rec["id"].startswith("digit-")
    return int(rec["id"].removeprefix("digit-"))


def _split_ids(out: Path) -> dict[str, list[int]]:
    return {s: [_index(r) for r in _lines(out, s)] for s in SPLITS}


def test_dataset_is_the_one_we_expect(sk):
    images, target = sk
    assert images.shape == (1797, 8, 8)
    assert np.bincount(target).tolist() == CLASS_COUNTS
    assert images.min() == 0 and images.max() == 16


def test_full_counts_and_stratification(full, sk):
    out, summary = full
    assert summary["splits"] == {"train": 1260, "dev": 179, "calib": 179, "test": 179}
    assert summary["samples"] == 1797 and summary["images"] == 1797
    assert summary["out_dir"] == str(out)
    ids = _split_ids(out)
    assert {s: len(v) for s, v in ids.items()} == summary["splits"]
    all_ids = [i for v in ids.values() for i in v]
    assert len(all_ids) == len(set(all_ids)) == 1797  # disjoint
    assert set(all_ids) == set(range(1797))  # cover
    target = sk[1]
    for s in ("dev", "calib", "test"):  # round(n/10) per digit: 18, except 17 for the 174 eights
        assert np.bincount(target[ids[s]], minlength=10).tolist() == [18] * 8 + [17, 18]
    train_counts = np.bincount(target[ids["train"]], minlength=10).tolist()
    assert train_counts == [n - 3 * (17 if d == 8 else 18) for d, n in enumerate(CLASS_COUNTS)]
    assert len(list((out / "images").glob("*.png"))) == 1797


@pytest.mark.parametrize("limit, per_digit, held", [
    (40, [4] * 10, 1),
    (100, [10] * 10, 1),
    # quotas ∝ class counts (largest remainder): the 183 threes get 21, the 174 eights 19
    (200, [20, 20, 20, 21, 20, 20, 20, 20, 19, 20], 2),
])
def test_limited_counts_and_stratification(tmp_path, sk, limit, per_digit, held):
    summary = digits.write_digits(tmp_path, seed=5, limit=limit)
    n_train = limit - 30 * held
    assert summary["splits"] == {"train": n_train, "dev": 10 * held, "calib": 10 * held, "test": 10 * held}
    assert summary["samples"] == limit and summary["images"] == limit
    ids = _split_ids(tmp_path)
    all_ids = [i for v in ids.values() for i in v]
    assert len(all_ids) == len(set(all_ids)) == limit
    target = sk[1]
    assert np.bincount(target[all_ids], minlength=10).tolist() == per_digit  # stratified subset
    for s in ("dev", "calib", "test"):
        assert np.bincount(target[ids[s]], minlength=10).tolist() == [held] * 10
    assert np.bincount(target[ids["train"]], minlength=10).tolist() == [n - 3 * held for n in per_digit]
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == sorted(
        f"digit-{i:05d}.png" for i in all_ids)


def test_labels_match_sklearn_and_request_shape(small, sk):
    out, _ = small
    target = sk[1]
    n = 0
    for s in SPLITS:
        for rec in _lines(out, s):
            i = _index(rec)
            assert rec["image"] == f"images/digit-{i:05d}.png"
            (q,) = rec["questions"]
            assert q["id"] == "q" and q["text"] == "Which digit is shown?"
            assert q["candidates"] == [str(d) for d in range(10)]
            assert q["answer"] == int(target[i])
            n += 1
    assert n == 100


def test_png_pixels_are_scaled_digits(small, full, sk):
    out, _ = small
    images, target = sk
    assert digits.scale_pixels(np.array([0, 1, 5, 8, 9, 13, 16])).tolist() == [0, 16, 80, 128, 143, 207, 255]
    expected = np.round(images * 255 / 16).astype(np.uint8)  # independent of the writer's integer formula
    assert (digits.scale_pixels(images) == expected).all()
    checked = 0
    for s in SPLITS:
        for rec in _lines(out, s):
            i = _index(rec)
            with Image.open(out / rec["image"]) as im:
                assert im.size == (8, 8) and im.mode in ("L", "RGB")
                px = np.asarray(im.convert("L"))
            assert px.dtype == np.uint8
            assert np.array_equal(px, expected[i]), i
            checked += 1
    assert checked == 100
    with Image.open(full[0] / "images" / "digit-00000.png") as im:
        assert np.asarray(im)[0].tolist() == [0, 0, 80, 207, 143, 16, 0, 0]  # sklearn row [0 0 5 13 9 1 0 0]


def test_every_line_parses_and_images_resolve_from_any_cwd(small, sk, tmp_path, monkeypatch):
    out, _ = small
    target = sk[1]
    monkeypatch.chdir(tmp_path)  # not the data folder
    for s in SPLITS:
        items = list(read_requests(out / f"{s}.jsonl"))
        assert len(items) == len(_lines(out, s))
        for n, item in items:
            assert isinstance(item, Request), (s, n, item)
            assert Path(item.image).is_file(), item.image
            (q,) = item.questions
            one_hot = [0.0] * 10
            one_hot[int(target[_index({"id": item.id})])] = 1.0
            assert list(q.rewards) == one_hot
    # a relative path to the JSONL file works too (images resolve against its folder)
    monkeypatch.chdir(out.parent)
    (_, item), *_ = read_requests(Path(out.name) / "dev.jsonl")
    assert isinstance(item, Request) and Path(item.image).is_file()


def test_constant_image_control(small, tmp_path, sk):
    out, _ = small
    summary = digits.write_digits(tmp_path, seed=0, limit=100, constant_image=True)
    assert summary["constant_image"] is True and summary["images"] == 1
    assert summary["splits"] == {"train": 70, "dev": 10, "calib": 10, "test": 10}
    assert [p.name for p in (tmp_path / "images").iterdir()] == ["constant.png"]
    paths = set()
    for s in SPLITS:
        const, real = _lines(tmp_path, s), _lines(out, s)
        assert len(const) == len(real)
        for c, r in zip(const, real):  # same requests, labels and split; only the image differs
            paths.add(c.pop("image"))
            r.pop("image")
            assert c == r
        for _, item in read_requests(tmp_path / f"{s}.jsonl"):
            assert isinstance(item, Request)
            paths.add(item.image)
    assert paths == {"images/constant.png", str(tmp_path / "images" / "constant.png")}
    images = sk[0]
    expected = np.rint(np.round(images * 255 / 16).mean(axis=0)).astype(np.uint8)
    with Image.open(tmp_path / "images" / "constant.png") as im:
        assert np.array_equal(np.asarray(im.convert("L")), expected)
    assert expected.min() == 0 and expected.max() > 150  # a blurry digit, not a blank


def test_same_seed_identical_files_different_seed_different_split(small, tmp_path, sk):
    out, _ = small
    again = tmp_path / "again"
    digits.write_digits(again, seed=0, limit=100)
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert len(files) == 104
    for f in files:
        assert (out / f).read_bytes() == (again / f).read_bytes(), f

    other = tmp_path / "other"
    digits.write_digits(other, seed=1, limit=100)
    a, b = _split_ids(out), _split_ids(other)
    assert {s: len(v) for s, v in a.items()} == {s: len(v) for s, v in b.items()}
    assert a["test"] != b["test"] and a["train"] != b["train"]
    # on the whole data set the seed changes the split but never the per-split counts
    target = sk[1]
    s0, s1 = digits.split_indices(target, seed=0), digits.split_indices(target, seed=1)
    assert s0 == digits.split_indices(target, seed=0)
    assert {k: len(v) for k, v in s0.items()} == {k: len(v) for k, v in s1.items()}
    assert len(set(s0["test"]) & set(s1["test"])) < 60  # ≈ 179 / 10 overlap expected by chance


def test_bad_arguments(tmp_path):
    for bad in (-1, 0, 39):
        with pytest.raises(DohnutsError, match="limit"):
            digits.write_digits(tmp_path / "x", limit=bad)
    with pytest.raises(DohnutsError, match="seed"):
        digits.write_digits(tmp_path / "x", seed=-1)
    assert not (tmp_path / "x").exists()  # validated before anything is written
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    with pytest.raises(DohnutsError, match="out_dir"):
        digits.write_digits(blocker / "sub", limit=40)


def test_cli(tmp_path, capsys):
    assert digits.main([str(tmp_path / "d"), "--limit", "40", "--seed", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "40 samples" in out[0] and "train 10, dev 10, calib 10, test 10" in out[0]
    assert len(_lines(tmp_path / "d", "train")) == 10

    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    cases = [(["--limit", "-5"], "--limit"), (["--limit", "39"], "--limit"), (["--limit", "abc"], "--limit"),
             (["--seed", "-1"], "--seed")]
    for extra, name in cases:
        assert digits.main([str(tmp_path / "e"), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and name in err[0] and "Traceback" not in err[0], err
    assert digits.main([str(blocker / "sub"), "--limit", "40"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "OUT_DIR" in err[0], err
    assert digits.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "OUT_DIR" in err[0], err


def test_cli_without_sklearn(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    assert digits.main([str(tmp_path / "d"), "--limit", "40"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dohnuts.train.digits: error: scikit-learn is needed for the digits task (pip install scikit-learn)"]


@pytest.mark.slow
def test_module_entry_point(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dohnuts.train.digits", str(tmp_path / "m"), "--limit", "40",
                        "--constant-image"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 1 and "constant image" in r.stdout
    r = subprocess.run([sys.executable, "-m", "dohnuts.train.digits", str(tmp_path / "m"), "--limit", "-3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--limit" in r.stderr


def test_digit_subset(tmp_path, sk):
    summary = digits.write_digits(tmp_path / "d01", digits=(1, 0))
    assert summary["digits"] == [0, 1]
    n = int(np.isin(sk[1], (0, 1)).sum())
    assert summary["samples"] == n
    labels = []
    for split in ("train", "dev", "calib", "test"):
        reqs = [r for _, r in read_requests(tmp_path / "d01" / f"{split}.jsonl")]
        split_labels = {r.questions[0].rewards.index(1.0) for r in reqs}
        assert split_labels == {0, 1}  # both digits in every split
        assert len(reqs[0].questions[0].candidates) == 10  # the questions still offer all ten
        labels += [r.questions[0].rewards.index(1.0) for r in reqs]
    assert len(labels) == n
    for bad in ((), (3, 12), (True,)):
        with pytest.raises(DohnutsError, match="digits"):
            digits.write_digits(tmp_path / "bad", digits=bad)
    assert digits.main([str(tmp_path / "cli"), "--digits", "2,3"]) == 0
