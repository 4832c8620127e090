"""Every example in the README and docs/ is run by a test exactly as printed.

Each fenced block of the documents below is claimed by one test (`EXAMPLES`: a text that occurs in
that block alone → the test); `test_every_example_is_claimed_by_a_test` fails when a block is added
or edited without its test. A command block runs line by line through `bash -c`, verbatim, in a
sandbox folder (`workloads/`, `hwspecs/` and `scripts/` linked in, as a clone holds them; every
other file a line names is made by the examples themselves — the README's request block writes its
image and request file, its workload line copies a workload and a spec), with this venv's scripts
first on PATH and this checkout first on PYTHONPATH. Python blocks run as scripts; the plugin guide's package is installed (a folder on
sys.path with its entry point, from the guide's TOML) and its workload run. Only the waiting of
`dohnuts-bench baseline` (10 minutes between runs) is compressed, by a fake clock: that line runs
in this process.

Not run here, and why: the install half of the README's two commands (`python3 -m venv … && pip
install …`: the network; .ci/run runs the test line whole, and the report of issue 34 times both on
a fresh clone) and `pytest` itself; docs/gpu.md's blocks, which need the lent H200 and the network
(their files, variables and pins are checked instead)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/architecture.md", "docs/measurement.md", "docs/plugins.md", "docs/gpu.md",
        "docs/known-issues.md", "hwspecs/README.md", "benchmarks/README.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    doc: str
    lang: str
    text: str


def blocks(doc: str) -> list[Block]:
    return [Block(doc, m.group(1), m.group(2)) for m in FENCE.finditer((ROOT / doc).read_text(encoding="utf-8"))]


# (document, a text found in exactly one of its blocks) → the test that runs that block
EXAMPLES = {
    ("README.md", "# the main job"): "test_readme_the_two_commands",
    ("README.md", "harness dohnuts/bench/"): "test_the_maps_name_what_exists",
    ("README.md", "--label before"): "test_readme_bench_commands",
    ("README.md", "dohnuts-bench gate --against main"): "test_readme_regression_gate",
    ("README.md", "import dohnuts"): "test_readme_api_snippet",
    ("README.md", "dohnuts predict --model tiny requests.jsonl"): "test_readme_predict_and_train",
    ("README.md", "python -m dohnuts.train.digits data/digits"): "test_readme_digits",
    ("README.md", '{"id": "r1"'): "test_readme_request_line",
    ("README.md", "field 'text_config.head_dim'"): "test_readme_config_error_line",
    ("README.md", "torchrun --nproc-per-node 2"): "test_readme_several_processes",
    ("README.md", "python scripts/benchmark.py dohnuts"): "test_readme_benchmark_a_trained_model",
    ("docs/architecture.md", "lifecycle  dohnuts/train/"): "test_the_maps_name_what_exists",
    ("docs/architecture.md", "request (JSON line)"): "test_the_maps_name_what_exists",
    ("docs/measurement.md", "workloads/scaling/"): "test_measurement_scaling_command",
    ("docs/measurement.md", "--format pytest-benchmark results/h200"): "test_measurement_export_commands",
    ("docs/plugins.md", "[project.entry-points.dohnuts_bench]"): "test_plugins_example",
    ("docs/plugins.md", "class Haystack"): "test_plugins_example",
    ("docs/plugins.md", "kind: haystack"): "test_plugins_example",
    ("docs/plugins.md", "dohnuts-bench: error: w.yaml"): "test_plugins_error_line",
    ("docs/gpu.md", "pip install -e '.[peer,nvidia]'"): "test_examples_checked_not_run",
    ("docs/gpu.md", "download.pytorch.org/whl/rocm"): "test_examples_checked_not_run",
    ("docs/gpu.md", "dohnuts-bench calibrate --hwspec rx7900xtx --write"): "test_examples_checked_not_run",
    ("docs/measurement.md", '"energy": {"joules": 1.234'): "test_examples_checked_not_run",
    ("docs/measurement.md", "fixed load points"): "test_examples_checked_not_run",
    ("docs/measurement.md", "burstiness: 0.5"): "test_examples_checked_not_run",
    ("docs/measurement.md", "distinct: 64"): "test_examples_checked_not_run",
    ("docs/measurement.md", "--json gate.json"): "test_examples_checked_not_run",
    ("docs/measurement.md", "nsys profile --capture-range=cudaProfilerApi"): "test_examples_checked_not_run",
    ("docs/measurement.md", "from hta.trace_analysis import TraceAnalysis"): "test_examples_checked_not_run",
    ("docs/measurement.md", "RUN/traces/<workload>-p<N>/<target>/rank0.json.gz"): "test_examples_checked_not_run",
    ("docs/gpu.md", "workloads/serving/text-2b-server.yaml"): "test_examples_checked_not_run",
    ("hwspecs/README.md", "method: dohnuts-bench calibrate"): "test_examples_checked_not_run",
    ("docs/gpu.md", "pip download --no-deps fla-core"): "test_gpu_session_examples",
    ("docs/gpu.md", "CAUSAL_CONV1D_FORCE_BUILD"): "test_gpu_session_examples",
    ("docs/gpu.md", "TESTS=all"): "test_gpu_session_examples",
    ("docs/gpu.md", "cat triton_cache.tgz"): "test_gpu_session_examples",
}


def example(doc: str, key: str) -> str:
    (block,) = [b for b in blocks(doc) if key in b.text]
    return block.text


def test_every_example_is_claimed_by_a_test():
    here = sys.modules[__name__]
    for doc in DOCS:
        for b in blocks(doc):
            keys = [k for (d, k) in EXAMPLES if d == doc and k in b.text]
            assert len(keys) == 1, f"{doc}: a block claimed by {len(keys)} tests ({keys}):\n{b.text}"
    for (doc, key), test in EXAMPLES.items():
        assert sum(key in b.text for b in blocks(doc)) == 1, f"{doc}: {key!r} must be in exactly one block"
        assert callable(getattr(here, test, None)), test


# -- running commands as printed -------------------------------------------------------------------


def _env(extra_path: str | None = None) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([extra_path] if extra_path else []))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["COLUMNS"] = "120"
    return env


def command_lines(text: str) -> list[str]:
    """The commands of a bash block: every line but blanks and comments, a `\\` continuation joined."""
    lines, current = [], ""
    for raw in text.splitlines():
        current += raw
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip() and not current.lstrip().startswith("#"):
            lines.append(current)
        current = ""
    return lines


def run(line: str, cwd: Path, *, ok=(0,), extra_path: str | None = None, timeout: int = 1200):
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=_env(extra_path), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode in ok, f"{line}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def make_user_folder(root: Path, *, text_alone: bool = False) -> Path:
    """`root` made a user's folder: a clone's workloads, hardware specs and scripts, nothing else —
    every file an example reads beyond them, an example makes. `text_alone`: its workloads/text.yaml
    with the dohnuts target alone (TEXT_ALONE), every other workload the clone's."""
    for folder in ("hwspecs", "scripts") + (() if text_alone else ("workloads",)):
        (root / folder).symlink_to(ROOT / folder)
    if text_alone:
        (root / "workloads").mkdir()
        for given in (ROOT / "workloads").iterdir():
            if given.name != "text.yaml":
                (root / "workloads" / given.name).symlink_to(given)
        (root / "workloads" / "text.yaml").write_text(text_alone_yaml())
    (root / ".venv").symlink_to(Path(sys.prefix))  # the README's `.venv/bin/...`: this test's venv
    return root


def text_alone_yaml() -> str:
    """workloads/text.yaml with its dohnuts target alone: what the test command runs where an
    example runs that workload several times (each run imports the transformers peer, seconds of
    CPU time; the peer runs in the main job, and the printed workload in the `full` lane)."""
    text = (ROOT / "workloads" / "text.yaml").read_text()
    assert "\ntargets: [dohnuts, transformers]\n" in text
    return text.replace("\ntargets: [dohnuts, transformers]\n", "\ntargets: [dohnuts]\n")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    """A user's folder (make_user_folder), one for the module's tests."""
    return make_user_folder(tmp_path_factory.mktemp("docs"))


# -- README ----------------------------------------------------------------------------------------


def test_readme_request_line(tmp_path):
    """The request block makes its image and writes one line of valid JSONL, a request the reader
    accepts with that image (run as printed; the commands after it read the same files)."""
    from dohnuts.runtime.requests import parse_line

    lines = command_lines(example("README.md", '{"id": "r1"'))
    assert len(lines) == 2 and lines[1].startswith("echo '{") and lines[1].endswith("}' > requests.jsonl")
    for line in lines:
        run(line, tmp_path)
    (text,) = (tmp_path / "requests.jsonl").read_text().splitlines()
    request = parse_line(text, source="requests.jsonl", base_dir=tmp_path)
    assert request.id == "r1" and request.questions[0].candidates == ("red", "green", "blue")
    from PIL import Image

    with Image.open(tmp_path / "photo.png") as image:
        assert image.size == (64, 64) and image.getpixel((0, 0)) == (255, 0, 0)


def test_readme_config_error_line(tmp_path, monkeypatch):
    """The README's example of a refused config.json is the error its reader raises."""
    from dohnuts.config import preset
    from dohnuts.errors import ConfigError
    from dohnuts.hf_config import to_hf_text_config
    from dohnuts.model.checkpoint import read_config

    expected = example("README.md", "field 'text_config.head_dim'").strip()
    (tmp_path / "ckpt").mkdir()
    text = {**to_hf_text_config(preset("tiny").text), "head_dim": 5000}
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        read_config(Path("ckpt"))
    assert str(info.value) == expected


def test_the_maps_name_what_exists():
    """Every path the README's and architecture.md's maps name exists."""
    texts = [example("README.md", "harness dohnuts/bench/"), example("docs/architecture.md", "lifecycle  dohnuts/train/"),
             example("docs/architecture.md", "request (JSON line)")]
    paths = {p.rstrip("/,") for t in texts for p in re.findall(r"[\w.]+(?:/[\w.]+)*/?[\w.]*\.py|[\w]+/[\w/]*", t)}
    assert paths
    missing = [p for p in sorted(paths) if not (ROOT / p).exists()]
    assert not missing, missing


def make_main_job(folder: Path) -> None:
    """The README's main job as printed, in `folder` made a user's folder (the clone's workloads,
    hardware specs and scripts; this test's venv as `.venv`): its run under folder/runs/bench,
    its output in folder/stdout.txt and stderr.txt. The `main_job_run` fixture (tests/conftest.py)
    makes it once for the whole test command: the standard suite on the CPU, which every test that
    only reads a standard-suite run reads."""
    first, _ = command_lines(example("README.md", "# the main job"))
    main_job = first.rpartition(" && ")[2]
    done = run(main_job, make_user_folder(folder))
    (folder / "stdout.txt").write_text(done.stdout)
    (folder / "stderr.txt").write_text(done.stderr)


@pytest.mark.slow(seconds=45)  # it makes the shared main-job run; the tests that read it come later
def test_readme_the_two_commands(main_job_run):
    """The main job, `.venv/bin/dohnuts-bench run`, as printed (the venv is this test's); the test
    command is .ci/run's (tests/test_docs.py), which CI runs whole."""
    first, second = command_lines(example("README.md", "# the main job"))
    install, _, main_job = first.rpartition(" && ")
    assert install.startswith("python3 -m venv .venv && .venv/bin/pip install --no-compile torch==")
    assert main_job == ".venv/bin/dohnuts-bench run" and second.endswith('.venv/bin/python -m pytest -n auto --dist worksteal -m "not timing and not full" && '
                                                                  '.venv/bin/python -m pytest -m timing')
    stdout, stderr = ((main_job_run / f"{name}.txt").read_text() for name in ("stdout", "stderr"))
    assert "Measured calls" in stdout and "This run's machine" in stdout
    for name in ("text", "shared-prefix", "image", "image-cache-cold", "image-cache-warm", "train-step"):
        assert f"measuring {name} · dohnuts" in stderr, name
    assert "measuring" not in stdout.split("Load while measuring")[0]  # status is on stderr
    (run_dir,) = (main_job_run / "runs" / "bench").iterdir()  # where the printed command writes
    assert (run_dir / "results.jsonl").is_file() and (run_dir / "report.txt").is_file()


@pytest.mark.slow(seconds=35)
@pytest.mark.parametrize("full", [pytest.param(False, id="dohnuts-alone"),
                                  pytest.param(True, id="as-printed", marks=pytest.mark.full)])
def test_readme_bench_commands(tmp_path, full):
    """The block as printed, in a user's folder whose workloads/text.yaml has its dohnuts target
    alone in the test command (three runs of it: text_alone_yaml), the clone's in the `full` lane."""
    sandbox = make_user_folder(tmp_path, text_alone=not full)
    for line in command_lines(example("README.md", "--label before")):
        done = run(line, sandbox, ok=(0, 1) if " compare " in line else (0,))
        if " compare " in line:
            assert "ratio" in done.stdout and "wall" in done.stdout
        if "workloads/gpu/" in line:
            assert "needs a CUDA GPU" in done.stderr and "nothing to run on this machine" in done.stderr
        if " analyze " in line:
            assert (sandbox / "after-report" / "report.txt").is_file()
        if " list" in line:
            assert "workload kinds:" in done.stdout
        if "--hwspec my-card.yaml" in line:  # the copies the line before made, measured against the copied spec
            (mine,) = (sandbox / "runs" / "bench").glob("*-my")
            assert json.loads((mine / "run.json").read_text())["hwspec"] == str((sandbox / "my-card.yaml").resolve())
    assert len(list((sandbox / "runs" / "bench").glob("*-before"))) == 1
    (before,) = (sandbox / "runs" / "bench").glob("*-before")
    targets = {json.loads(x)["target"] for x in (before / "results.jsonl").read_text().splitlines()}
    assert targets == ({"dohnuts", "transformers"} if full else {"dohnuts"})


@pytest.mark.slow(seconds=25)
@pytest.mark.parametrize("full", [pytest.param(False, id="dohnuts-alone"),
                                  pytest.param(True, id="with-its-peer", marks=pytest.mark.full)])
def test_readme_regression_gate(tmp_path, full):
    """The interleaved gate as printed, at a size a test affords (3 rounds of 3 call pairs appended:
    the printed 10 × 50 takes minutes; in the test command on the printed workload's dohnuts target
    alone — every round starts fresh processes, and the transformers peer's import costs each of
    them seconds — in the `full` lane with its peer), in a clone of this checkout whose `main` is
    its HEAD — so this work tree against itself: a verdict either way (what the gate catches is
    benchmarks/maintainers/gate_detection.py's to measure)."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(repo)], check=True)
    if subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", "main"],
                      capture_output=True).returncode:
        subprocess.run(["git", "-C", str(repo), "branch", "main", "HEAD"], check=True)
    (line,) = command_lines(example("README.md", "dohnuts-bench gate --against main"))
    line = line.split("#")[0].strip()
    assert line.endswith(" workloads/text.yaml")
    if not full:  # the same workload, its dohnuts target alone (an untracked file of the work tree)
        (repo / "alone").mkdir()
        (repo / "alone" / "text.yaml").write_text(text_alone_yaml())
        line = line.replace(" workloads/text.yaml", " alone/text.yaml")
    done = run(line + " --rounds 3 --calls 3 --json gate.json", repo, ok=(0, 1))
    lines = done.stdout.splitlines()
    verdicts = [x for x in lines if " · " in x and ": ratio " in x and "over 3 rounds" in x]
    assert any(x.startswith("text · dohnuts: ratio ") for x in verdicts)
    assert any(x.startswith("text · transformers: ratio ") for x in verdicts) == full
    (detects,) = [x for x in lines if x.startswith("smallest slowdown this run detects 9 times in 10: ")]
    assert any(x.startswith("load (cores kept busy by other processes) per round: ") for x in lines)
    data = json.loads((repo / "gate.json").read_text())
    assert data["rounds"] == 3 and data["calls"] == 3 and len(data["load"]) == 3
    assert data["first"] == ["base", "candidate", "base"]
    assert {g["name"] for g in data["groups"]} == {x.split(": ratio ")[0] for x in verdicts}
    assert all(len(g["round_ratios"]) == 3 and g["ratio"] > 0 for g in data["groups"])


@pytest.mark.slow  # a new Python process with torch: about 10 s on the loaded 2-core machine
def test_readme_api_snippet(tmp_path):
    text = example("README.md", "import dohnuts")
    assert "RANDOM weights" in text
    (tmp_path / "snippet.py").write_text(text)
    done = run(f"{shlex.quote(sys.executable)} snippet.py", tmp_path)
    probabilities, choice = done.stdout.strip().rsplit(" ", 1)
    p = json.loads(probabilities)
    assert len(p) == 2 and abs(sum(p) - 1) < 1e-5 and choice in ("0", "1")


@pytest.mark.slow(seconds=20)
@pytest.mark.parametrize("full", [pytest.param(False, id="at-a-test-s-size"),
                                  pytest.param(True, id="as-printed", marks=pytest.mark.full)])
def test_readme_predict_and_train(sandbox, tmp_path, full):
    """The README's predict and train lines: as printed (100 updates, and the synthetic task learned)
    in the `full` lane; at 2 updates in the test command, as the other training examples (the lines
    run, the run finishes, selects, tests and says so on --resume; that the tiny preset learns the
    synthetic task: tests/train/test_learning.py)."""
    for given in sandbox.iterdir():  # the user's files, in a folder of this parametrization's own
        if given.name not in ("runs", "out.jsonl", "requests.jsonl", "photo.png"):
            (tmp_path / given.name).symlink_to(given)
    for line in command_lines(example("README.md", '{"id": "r1"')):  # the request file these commands read
        run(line, tmp_path)
    lines = command_lines(example("README.md", "dohnuts predict --model tiny requests.jsonl"))
    outputs = [run(line if full or "--updates" not in line else at_a_test_s_size(line, 2), tmp_path)
               for line in lines]
    (record,) = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert record["id"] == "r1" and len(record["questions"][0]["probabilities"]) == 3
    summary = json.loads((tmp_path / "runs" / "tiny" / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.5 if full else 0.0 <= summary["test_accuracy"] <= 1.0
    assert "holds a finished run" in outputs[2].stderr  # --resume of the finished run says so


def at_a_test_s_size(line: str, updates: int) -> str:
    """A training line of an example at a size a test affords: `--updates` set (replaced where the
    line gives it, appended where it takes the default). The full size runs in the `full` lane."""
    if "--updates " in line:
        return re.sub(r"--updates \d+", f"--updates {updates}", line)
    return f"{line} --updates {updates}"


def digits_data_at_a_test_s_size(line: str, samples: int = 200) -> str:
    """The README's digits data line at a size a test affords: a stratified subset of `samples` of
    the 1,797 images (`--limit`, an option of that command; 200 leaves 20 questions in each of dev,
    calib and test, which every run evaluates, where the whole set has 180). The whole set runs in
    the `full` lane."""
    command = line.split("#")[0].strip()
    assert command == "python -m dohnuts.train.digits data/digits", line
    return f"{command} --limit {samples}"


@pytest.mark.slow(seconds=960)
@pytest.mark.full
def test_readme_digits(sandbox):
    """The digits example at its defaults, and the accuracy the README states (82.1 %; chance 10 %)."""
    pytest.importorskip("sklearn")
    for line in command_lines(example("README.md", "python -m dohnuts.train.digits data/digits")):
        run(line, sandbox)
    summary = json.loads((sandbox / "runs" / "digits" / "summary.json").read_text())
    assert summary["test_accuracy"] >= 0.75, summary
    readme = (ROOT / "README.md").read_text()
    assert "82.1 % test accuracy" in readme


@pytest.mark.slow(seconds=15)
def test_readme_digits_at_a_test_s_size(tmp_path):
    """The digits example as printed but for its size (2 updates on 200 of the images; the full 200
    updates on every image are test_readme_digits, in the `full` lane): the data as the README makes
    it, a run that trains, selects, calibrates and tests on it. That the task is learned:
    tests/train/test_digits_training.py."""
    pytest.importorskip("sklearn")
    make, train = command_lines(example("README.md", "python -m dohnuts.train.digits data/digits"))
    run(digits_data_at_a_test_s_size(make), tmp_path)
    assert train.startswith("dohnuts train ") and "--updates" not in train  # the README runs the defaults
    run(at_a_test_s_size(train, 2), tmp_path)
    summary = json.loads((tmp_path / "runs" / "digits" / "summary.json").read_text())
    tests = len((tmp_path / "data" / "digits" / "test.jsonl").read_text().splitlines())
    assert summary["test_questions"] == tests and 0.0 <= summary["test_accuracy"] <= 1.0
    assert summary["best_update"] in (0, 2) and summary["temperature"] > 0


@pytest.mark.slow(seconds=200)
@pytest.mark.full
def test_readme_several_processes(sandbox):
    pytest.importorskip("sklearn")
    if not (sandbox / "data" / "digits" / "test.jsonl").exists():  # the digits example's data, as printed
        run(command_lines(example("README.md", "python -m dohnuts.train.digits data/digits"))[0], sandbox)
    for line in command_lines(example("README.md", "torchrun --nproc-per-node 2")):
        run(line, sandbox)
    assert (sandbox / "runs" / "digits-2" / "summary.json").is_file()
    assert (sandbox / "runs" / "digits-3" / "summary.json").is_file()
    out = (sandbox / "test-out.jsonl").read_text().splitlines()
    assert len(out) == len((sandbox / "data" / "digits" / "test.jsonl").read_text().splitlines())


@pytest.mark.slow(seconds=25)
@pytest.mark.parametrize("full", [pytest.param(False, id="at-a-test-s-size"),
                                  pytest.param(True, id="as-printed", marks=pytest.mark.full)])
def test_readme_benchmark_a_trained_model(tmp_path, full):
    """Train, then the specification's benchmark command on the run, as printed — but for the
    training's length in the test command (2 updates where it says 20; as printed in the `full` lane)."""
    sandbox = make_user_folder(tmp_path)
    for line in command_lines(example("README.md", "python scripts/benchmark.py dohnuts")):
        run(line if full or "--updates" not in line else at_a_test_s_size(line, 2), sandbox)
    records = [json.loads(x) for x in (sandbox / "runs" / "v1" / "benchmarks" / "dohnuts.jsonl").read_text().splitlines()]
    kinds = {r["workload"]["kind"] for r in records}
    assert {"text", "shared-prefix", "image", "image-cache"} <= kinds and "train-step" not in kinds
    assert all(r["target_options"]["adapter"].endswith("runs/v1/best.safetensors") for r in records)


@pytest.mark.slow(seconds=55)
def test_readme_several_processes_at_a_test_s_size(tmp_path):
    """The several-processes example as printed but for its size (2 updates where it says 20, on 200
    of the digits images; the full size is test_readme_several_processes, in the `full` lane): both
    ways of starting torchrun train and finish, and two processes predict every line in order."""
    pytest.importorskip("sklearn")
    run(digits_data_at_a_test_s_size(command_lines(example("README.md", "python -m dohnuts.train.digits data/digits"))[0]),
        tmp_path)
    for line in command_lines(example("README.md", "torchrun --nproc-per-node 2")):
        run(at_a_test_s_size(line, 2) if "--updates" in line else line, tmp_path)
    assert (tmp_path / "runs" / "digits-2" / "summary.json").is_file()
    assert (tmp_path / "runs" / "digits-3" / "summary.json").is_file()
    out = [json.loads(x)["id"] for x in (tmp_path / "test-out.jsonl").read_text().splitlines()]
    ids = [json.loads(x)["id"] for x in (tmp_path / "data" / "digits" / "test.jsonl").read_text().splitlines()]
    assert out == ids


# -- docs/ -----------------------------------------------------------------------------------------


@pytest.mark.slow  # a new Python process with torch: about 10 s on the loaded 2-core machine
def test_measurement_scaling_command(sandbox):
    """On a CPU every scaling workload needs a GPU: the command says so and measures nothing."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the scaling run is a GPU session's, not a test's")
    (line,) = command_lines(example("docs/measurement.md", "workloads/scaling/"))
    done = run(line, sandbox)
    assert done.stderr.count("needs a CUDA GPU") == 2 and "nothing to run on this machine" in done.stderr


@pytest.mark.slow  # five new processes, two with torch
def test_measurement_export_commands(tmp_path):
    """The export block run as printed on the committed H200 run (linked into a folder of its own,
    so nothing is written beside the repository's results); each output read as its format."""
    run_dir = "results/h200/2026-12-04-s20-peers-at-best"
    (tmp_path / run_dir).parent.mkdir(parents=True)
    (tmp_path / run_dir).symlink_to(ROOT / run_dir)
    outputs = []
    for line in command_lines(example("docs/measurement.md", "--format pytest-benchmark results/h200")):
        outputs.append(run(line, tmp_path))
    assert "text[dohnuts]" in outputs[1].stdout and "Failed to load" not in outputs[1].stdout + outputs[1].stderr
    assert json.loads((tmp_path / "h200-suite.json").read_text())["benchmarks"]
    assert json.loads((tmp_path / "h200-suite.pytorch.json").read_text())[0]["benchmark"]["name"] == "dohnuts-bench"
    assert (tmp_path / "h200-suite.csv").read_text().startswith("run_id,workload,")
    assert json.loads((tmp_path / "record.schema.json").read_text())["$defs"]["ReportedRecord"]


@pytest.mark.slow
def test_plugins_example(sandbox, tmp_path):
    """The guide's plugin, installed as its TOML declares it, registers its kind; its workload runs."""
    import tomllib

    table = tomllib.loads(example("docs/plugins.md", "[project.entry-points.dohnuts_bench]"))
    ((name, target),) = table["project"]["entry-points"]["dohnuts_bench"].items()
    module, _, attr = target.partition(":")
    assert module == "acme_bench.plugin" and not attr
    site = tmp_path / "site"
    (site / "acme_bench").mkdir(parents=True)
    (site / "acme_bench" / "__init__.py").write_text("")
    (site / "acme_bench" / "plugin.py").write_text(example("docs/plugins.md", "class Haystack"))
    dist = site / "acme_bench-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-bench\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[dohnuts_bench]\n{name} = {target}\n")
    (sandbox / "haystack.yaml").write_text(example("docs/plugins.md", "kind: haystack"))
    listed = run("dohnuts-bench list", sandbox, extra_path=str(site))
    assert "haystack" in listed.stdout and "needle_depth" in listed.stdout
    done = run("dohnuts-bench run haystack.yaml", sandbox, extra_path=str(site))
    assert "haystack" in done.stdout and "Measured calls" in done.stdout


@pytest.mark.slow  # a new Python process with torch: about 10 s on the loaded 2-core machine
def test_plugins_error_line(sandbox):
    """The guide's example of a refused target option is the line the command prints."""
    expected = example("docs/plugins.md", "dohnuts-bench: error: w.yaml").strip()
    (sandbox / "w.yaml").write_text('kind: text\nmodel: tiny\ntargets: [{name: dohnuts, options: {lora_rank: "8"}}]\n')
    done = run("dohnuts-bench run w.yaml", sandbox, ok=(2,))
    assert done.stderr.strip() == expected


def test_gpu_session_examples():
    """docs/gpu.md's blocks need the lent H200 and the network: checked, not run — the script
    parses, reads the variables the examples set, the workloads exist, and the pins match
    pyproject.toml's."""
    import tomllib

    download = example("docs/gpu.md", "pip download --no-deps fla-core")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for pin in re.findall(r"(fla-core==[\d.]+)", download):
        assert pin in deps
    session = example("docs/gpu.md", "TESTS=all")
    script = (ROOT / "benchmarks" / "maintainers" / "gpu_session.sh").read_text()
    for var in re.findall(r"\b([A-Z_]+)=", session):
        assert f"${{{var}" in script or f"${var}" in script, var
    for path in re.findall(r"workloads/[\w/.-]+\.yaml", session):
        assert (ROOT / path).is_file(), path
    build = example("docs/gpu.md", "CAUSAL_CONV1D_FORCE_BUILD")  # the peer's causal-conv1d wheel, built here
    assert "torch==2.11.0" in build and "causal-conv1d==1.7.0" in build and "arch=compute_90,code=sm_90" in build
    for text in (session, example("docs/gpu.md", "cat triton_cache.tgz"), build):
        code = " ".join(line for line in command_lines(text.replace("... ", "")))
        assert subprocess.run(["bash", "-n", "-c", code]).returncode == 0
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "maintainers" / "gpu_session.sh")]).returncode == 0


def test_examples_checked_not_run():
    """Blocks that need a GPU, ROCm or the network, and fragments of files: checked, not run —
    the extras and scripts they name exist, the fragments parse as what they show."""
    import tomllib

    import yaml

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"peer", "nvidia", "amd"} <= set(extras)
    rocm = example("docs/gpu.md", "download.pytorch.org/whl/rocm")
    assert "bash benchmarks/card_kit.sh" in rocm and (ROOT / "benchmarks" / "card_kit.sh").is_file()
    kit = example("docs/gpu.md", "dohnuts-bench calibrate --hwspec rx7900xtx --write")
    assert "dohnuts-bench run --hwspec" in kit and (ROOT / "hwspecs" / "rx7900xtx.yaml").is_file()
    from dohnuts.bench.analysis.records import Energy
    from dohnuts.schema import convert

    for line in example("docs/measurement.md", '"energy": {"joules": 1.234').strip().splitlines():
        convert(json.loads("{" + line + "}")["energy"], Energy, source="docs/measurement.md")
    serving = yaml.safe_load(example("docs/measurement.md", "fixed load points"))
    assert serving["scenario"] == "server" and serving["serving"]["slo_ms"] == 100
    from dohnuts.bench.measure.serving.config import ServingFields, check_serving

    loads = yaml.safe_load(example("docs/measurement.md", "burstiness: 0.5"))
    fields = convert(loads["serving"], ServingFields, source="docs/measurement.md")
    assert fields.concurrency == [1, 2, 4, 8] and fields.search.over == "concurrency" and fields.burstiness == 0.5
    check_serving("server", fields, ROOT / "docs" / "measurement.md", source="docs/measurement.md", processes=(1,),
                  kind_is_train=False)

    from dohnuts.bench.cli import build_parser

    for line in command_lines(example("docs/measurement.md", "--json gate.json")):  # run: test_readme_regression_gate
        args = build_parser().parse_args(shlex.split(line.split("#")[0])[1:])
        assert args.command == "gate" and args.against == "main"
    vary = yaml.safe_load(example("docs/measurement.md", "distinct: 64"))
    assert convert(vary["serving"], ServingFields, source="docs/measurement.md").vary.distinct == 64
    for word in example("docs/gpu.md", "workloads/serving/text-2b-server.yaml").split():
        if word.strip("'").startswith("workloads/"):
            assert (ROOT / word.split("=")[-1].strip("'")).is_file(), word
    # Nsight Systems' capture of the measured calls (a GPU and nsys): dohnuts-bench's part parses as a
    # `run --nvtx` of a workload file that exists, and nsys captures from the profiler API only
    capture = " ".join(example("docs/measurement.md", "nsys profile --capture-range=cudaProfilerApi").split("\\\n"))
    words = shlex.split(capture)
    assert words[0] == "nsys" and "--capture-range=cudaProfilerApi" in words and "nvtx" in words[words.index("-t") + 1]
    args = build_parser().parse_args(words[words.index("dohnuts-bench") + 1:])
    assert args.command == "run" and args.nvtx and all((ROOT / w).is_file() for w in args.workloads)
    from dohnuts.bench.measure.trace import rank_trace_path

    layout = example("docs/measurement.md", "RUN/traces/<workload>-p<N>/<target>/rank0.json.gz").split()[0].rstrip(",")
    assert layout.replace("<target>", "dohnuts") == str(rank_trace_path(Path("RUN/traces/<workload>-p<N>"), "dohnuts", 0))
    # HTA (not a dependency): the snippet parses, and reads the folder the layout above names
    hta = example("docs/measurement.md", "from hta.trace_analysis import TraceAnalysis")
    compile(hta, "docs/measurement.md", "exec")
    assert 'trace_dir="runs/bench/RUN/traces/text-2b-p2/dohnuts"' in hta
    measured = example("hwspecs/README.md", "method: dohnuts-bench calibrate")
    assert measured.startswith("measured:") and "date:" in measured and "device:" in measured
