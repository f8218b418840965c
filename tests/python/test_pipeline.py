"""feedline from Python: the same batches and states as the C++ tool, exact resume, tensors that share
the batch's slot and keep it while they live, typed errors with file and offset, and clean stops."""
import gc
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
import time

import pytest
import torch

import feedline
from conftest import iterate

CONFIG = dict(batch_size=4, seq_len=32, seed=7, workers=2, device="cpu")


def cli_args(batches, mode="windows", extra=()):
    return ["--batch-size", "4", "--seq-len", "32", "--seed", "7", "--workers", "2", "--device", "cpu", "--mode", mode,
            "--batches", str(batches), *extra]


@pytest.mark.parametrize("kind,mode", [("megatron", "windows"), ("megatron", "packed"), ("llmc", "windows")])
def test_batches_and_state_equal_the_cpp_tools(data, kind, mode):
    spec = data[kind]
    pipe = feedline.Pipeline(spec, mode=mode, max_steps=25, **CONFIG)
    total, steps = 0, []
    for b in pipe:
        assert b.inputs.dtype == torch.int32 and tuple(b.inputs.shape) == (4, 32)
        assert b.inputs.device.type == "cpu"
        total += int(b.inputs.to(torch.int64).sum())
        steps.append(b.step)
    assert steps == list(range(25))
    cpp = iterate(spec, *cli_args(25, mode))
    assert total == cpp["token_sum"]
    assert pipe.state_dict() == cpp["state"]
    json.dumps(pipe.state_dict())  # serialisable as it is


@pytest.mark.parametrize("kind,mode", [("megatron", "windows"), ("llmc", "packed")])
def test_s3_urls_give_the_local_files_batches(data, s3, kind, mode):
    local = feedline.Pipeline(data[kind], mode=mode, max_steps=15, **CONFIG)
    remote = feedline.Pipeline(s3[kind], mode=mode, max_steps=15, **CONFIG)
    for a, b in zip(local, remote, strict=True):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert remote.state_dict() == local.state_dict()
    stats = remote.stats()
    assert stats["remote_requests"] > 0 and stats["remote_failures"] == 0
    with pytest.raises(feedline.IoError, match="no such dataset|matches no file"):
        feedline.Pipeline(s3[kind].replace("data/", "missing/"), max_steps=1, **CONFIG)


def test_text_tokenized_on_the_fly_equals_the_cpp_tool(data):
    pipe = feedline.Pipeline(data["jsonl"], tokenizer=data["model"], max_steps=12, **CONFIG)
    total = sum(int(b.inputs.to(torch.int64).sum()) for b in pipe)
    cpp = iterate(data["jsonl"], *cli_args(12, extra=("--tokenizer", data["model"])))
    assert total == cpp["token_sum"]
    assert pipe.state_dict() == cpp["state"]


def test_batches_say_their_epoch_and_stats_say_each_datasets(data):
    per = len(feedline.Pipeline(data["megatron"], epochs=1, **CONFIG))
    pipe = feedline.Pipeline(data["megatron"], max_steps=2 * per + 1, **CONFIG)
    assert pipe.stats()["epoch"] == 0 and pipe.stats()["epochs"] == [0]  # before the first batch
    seen = []
    for b in pipe:
        assert b.epoch == b.step // per  # windows: every epoch has the same steps
        assert pipe.stats()["epoch"] == b.epoch
        seen.append(b.epoch)
    assert seen[0] == 0 and seen[-1] == 2 and seen == sorted(seen)
    # Packed rows: an epoch's steps depend on its document order; each batch still says its own.
    packed = dict(CONFIG, mode="packed")
    first = len(feedline.Pipeline(data["megatron"], epochs=1, **packed))
    two = [b.epoch for b in feedline.Pipeline(data["megatron"], epochs=2, **packed)]
    assert two[:first] == [0] * first and two[first:] and set(two[first:]) == {1}
    # A blend: each dataset walks its own epochs; the batch says the first dataset's.
    spec = f"0.9 {data['megatron']} 0.1 {data['llmc']}"
    blend = feedline.Pipeline(spec, max_steps=3 * per, **CONFIG)
    last = None
    for last in blend:
        pass
    epochs = blend.stats()["epochs"]
    assert len(epochs) == 2 and last.epoch == epochs[0] >= 1 and epochs[1] < epochs[0]  # 10% of the draws: fewer passes
    # kept and copied batches keep their epoch
    kept = [b.keep() for b in feedline.Pipeline(data["megatron"], max_steps=per + 1, **CONFIG)]
    assert [b.epoch for b in kept] == [s // per for s in range(per + 1)]


def test_a_blend_string_and_a_path_object_are_read_as_the_tools_read_them(data):
    spec = f"0.7 {data['megatron']} 0.3 {data['llmc']}"  # Megatron's --data-path form, as the C++ tools take it
    pipe = feedline.Pipeline(spec, max_steps=6, **CONFIG)
    total = sum(int(b.inputs.to(torch.int64).sum()) for b in pipe)
    cpp = iterate(spec, *cli_args(6))
    assert total == cpp["token_sum"]
    assert pipe.state_dict() == cpp["state"]
    assert len(pipe.state_dict()["weights"]) == 2
    assert len(list(feedline.Pipeline(Path(data["megatron"]), max_steps=2, **CONFIG))) == 2


def test_a_mixture_file_is_a_data_spec_with_per_domain_stats_and_exact_resume(data, tmp_path):
    """A mixture file (domains with their data, stages of weights) where a dataset goes: the same batches
    as feedline-iterate, each domain's samples in stats(), a state_dict that resumes exactly, and an
    edited schedule refused unless mixture_change="from_step"."""
    mix = tmp_path / "mix.json"

    def write(stages):
        mix.write_text(json.dumps({"domains": [{"name": "web", "data": data["megatron"]}, {"name": "code", "data": data["llmc"]}],
                                   "stages": stages}))

    write([{"at_step": 0, "weights": {"web": 3, "code": 1}}, {"at_step": 4, "ramp_steps": 2, "weights": {"web": 1, "code": 3}}])
    pipe = feedline.Pipeline(mix, max_steps=10, **CONFIG)
    batches = [b.inputs.tolist() for b in pipe]
    cpp = iterate(str(mix), *cli_args(10))
    assert sum(sum(sum(row) for row in b) for b in batches) == cpp["token_sum"]
    assert pipe.state_dict() == cpp["state"]
    domains = pipe.stats()["datasets"]
    assert [d["name"] for d in domains] == ["web", "code"]
    assert sum(d["samples"] for d in domains) == 10 * CONFIG["batch_size"]
    assert domains[1]["share"] == pytest.approx(0.75)
    first = feedline.Pipeline(mix, max_steps=10, **CONFIG)
    head = [b.inputs.tolist() for _, b in zip(range(5), first)]
    state = first.state_dict()
    assert state["version"] == 3 and state["mixture"] == 1
    resumed = feedline.Pipeline(mix, max_steps=10, **CONFIG)
    resumed.load_state_dict(state)
    assert head + [b.inputs.tolist() for b in resumed] == batches
    write([{"at_step": 0, "weights": {"web": 3, "code": 1}}, {"at_step": 5, "weights": {"code": 1}}])
    edited = feedline.Pipeline(mix, max_steps=10, **CONFIG)
    with pytest.raises(feedline.ConfigError):
        edited.load_state_dict(state)
    edited.load_state_dict(state, mixture_change="from_step")
    rest = [b.datasets.tolist() for b in edited]
    assert rest == [[1] * CONFIG["batch_size"]] * 5  # every row from code


def test_mixture_weights_set_during_the_run_take_effect_at_their_step_and_resume_exactly(data, tmp_path):
    """Online mixing: weights set by name for a later step, in the state_dict at once; the batches from
    that step come from the domains weighted; a state saved in between resumes into the same batches."""
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({"domains": [{"name": "web", "data": data["megatron"]}, {"name": "code", "data": data["llmc"]}],
                               "stages": [{"at_step": 0, "weights": {"web": 1, "code": 1}}]}))
    pipe = feedline.Pipeline(mix, max_steps=40, **CONFIG)
    it = iter(pipe)
    head = [next(it).datasets.tolist() for _ in range(3)]
    at = 3 + pipe.planning_horizon()
    with pytest.raises(feedline.ConfigError, match="planned already"):
        pipe.set_mixture_weights([1, 1], step=1)
    with pytest.raises(feedline.ConfigError, match="no domain named"):
        pipe.set_mixture_weights({"books": 1}, step=at)
    assert pipe.set_mixture_weights({"code": 1}, step=at) == at  # web left out: 0
    state = pipe.state_dict()
    assert state["version"] == 4 and state["pending_weights"] == [{"step": at, "weights": [0.0, 1.0]}]
    rest = [b.datasets.tolist() for b in pipe]
    assert all(row == [1] * CONFIG["batch_size"] for row in rest[at - 3:])
    assert any(0 in row for row in head + rest[:at - 3])
    assert pipe.stats()["datasets"][1]["share"] == pytest.approx(1.0)
    resumed = feedline.Pipeline(mix, max_steps=40, **CONFIG)
    resumed.load_state_dict(state)
    assert [b.datasets.tolist() for b in resumed] == rest


def test_path_objects_are_taken_for_option_paths_and_tokenizer_models(data):
    by_path = feedline.Pipeline(Path(data["jsonl"]), tokenizer=Path(data["model"]), cache_dir=Path(data["dir"]) / "counts",
                                max_steps=3, **CONFIG)
    by_str = feedline.Pipeline(data["jsonl"], tokenizer=data["model"], max_steps=3, **CONFIG)
    assert [b.inputs.tolist() for b in by_path] == [b.inputs.tolist() for b in by_str]
    assert feedline.Tokenizer(Path(data["model"])).encode("hello world") == feedline.Tokenizer(data["model"]).encode("hello world")


@pytest.mark.parametrize("kind", ["megatron", "llmc"])
def test_shuffle_none_reads_windows_in_order(data, kind):
    """shuffle="none": the documents and the windows in file order, so row k of a single rank is the data's
    tokens [k T, (k + 1) T) (windows mode, tokens in the order feedline-inspect --dump-tokens writes them)."""
    import struct
    from conftest import bin_dir
    dumped = subprocess.run([str(bin_dir() / "feedline-inspect"), "--dump-tokens", data[kind]], capture_output=True, check=True).stdout
    tokens = list(struct.unpack(f"<{len(dumped) // 4}I", dumped))
    pipe = feedline.Pipeline(data[kind], shuffle="none", max_steps=5, **CONFIG)
    T = CONFIG["seq_len"]
    rows = [row for b in pipe for row in b.inputs.tolist()]
    assert rows == [tokens[k * T:(k + 1) * T] for k in range(len(rows))]


def test_targets_with_nothing_to_predict_are_what_cross_entropy_ignores(data):
    """Packed rows: each piece's last target and the padding are -100 from Python (torch's default
    ignore_index), or the ignore_index asked for; the tokens elsewhere are the same either way."""
    by_default = [(b.inputs.clone(), b.targets.clone()) for b in feedline.Pipeline(data["megatron"], mode="packed", max_steps=4, **CONFIG)]
    asked = [(b.inputs.clone(), b.targets.clone()) for b in
             feedline.Pipeline(data["megatron"], mode="packed", max_steps=4, ignore_index=-1, **CONFIG)]
    for (inputs, targets), (inputs1, targets1) in zip(by_default, asked):
        assert torch.equal(inputs, inputs1)
        ignored = targets == -100
        assert ignored.any() and torch.equal(ignored, targets1 == -1)
        assert torch.equal(targets[~ignored], targets1[~ignored]) and int(targets[~ignored].min()) >= 0
        logits = torch.randn(*targets.shape, 512)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, 512), targets.reshape(-1).long())
        kept = torch.nn.functional.cross_entropy(logits[~ignored], targets[~ignored].long())
        assert torch.allclose(loss, kept)
    with pytest.raises(feedline.ConfigError, match="ignore_index"):
        feedline.Pipeline(data["megatron"], ignore_index="x", **CONFIG)


@pytest.mark.parametrize("mode", ["windows", "packed"])
def test_resume_from_state_dict_continues_with_the_same_batches(data, mode):
    full = [(b.inputs.clone(), b.targets.clone()) for b in feedline.Pipeline(data["megatron"], mode=mode, max_steps=30, **CONFIG)]
    first = feedline.Pipeline(data["megatron"], mode=mode, max_steps=30, **CONFIG)
    for _ in range(11):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))  # through JSON, as a checkpoint would keep it
    del first
    resumed = feedline.Pipeline(data["megatron"], mode=mode, max_steps=30, **dict(CONFIG, workers=1))  # another worker count
    resumed.load_state_dict(state)
    rest = [(b.step, b.inputs.clone(), b.targets.clone()) for b in resumed]
    assert [s for s, _, _ in rest] == list(range(11, 30))
    for (step, x, y) in rest:
        assert torch.equal(x, full[step][0]) and torch.equal(y, full[step][1])


def test_a_state_of_another_global_batch_is_refused_or_goes_on_from_the_same_sample(data):
    """Saved with batch 4 after 11 steps, loaded into a Pipeline of batch 6: refused by default; with
    global_batch_change="from_same_sample" (and a warning) row j of its step 11 + i is the window a batch-1
    run reads at 44 + 6 i + j (shuffle="none": windows in file order, all in the first epoch here)."""
    config = dict(CONFIG, shuffle="none")
    first = feedline.Pipeline(data["megatron"], **config)
    for _ in range(11):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))
    del first
    wider = feedline.Pipeline(data["megatron"], max_steps=16, **dict(config, batch_size=6))
    with pytest.raises(feedline.ConfigError, match="state.global_batch"):
        wider.load_state_dict(state)
    with pytest.raises(ValueError, match="global_batch_change"):
        wider.load_state_dict(state, global_batch_change="yes")
    with pytest.warns(UserWarning, match="global batch of 4 samples per step; this Pipeline takes 6"):
        wider.load_state_dict(state, global_batch_change="from_same_sample")
    assert len(wider) == 16
    rows = [(b.step, b.inputs.tolist()) for b in wider]
    assert [s for s, _ in rows] == list(range(11, 16))
    single = [row for b in feedline.Pipeline(data["megatron"], max_steps=44 + 30, **dict(config, batch_size=1)) for row in b.inputs.tolist()]
    assert [row for _, batch in rows for row in batch] == single[44:44 + 30]
    resumed = wider.state_dict()
    assert resumed["global_batch"] == 6 and resumed["origin_step"] == 11 and resumed["origin_drawn"] == 44


def test_packed_batches_carry_positions_and_cu_seqlens(data):
    b = next(feedline.Pipeline(data["megatron"], mode="packed", max_steps=1, **CONFIG))
    assert tuple(b.positions.shape) == (4, 32) and tuple(b.cu_seqlens.shape) == (4, 33)
    assert torch.all(b.cu_seqlens[:, 0] == 0)
    w = next(feedline.Pipeline(data["megatron"], max_steps=1, **CONFIG))
    assert w.positions is None and w.cu_seqlens is None


def test_a_tensor_kept_past_later_steps_keeps_its_values_and_holding_too_many_is_an_error(data):
    pipe = feedline.Pipeline(data["megatron"], prefetch=4, **CONFIG)
    kept = next(pipe).inputs            # the Batch object is gone; the tensor alone holds the slot
    copy = kept.clone()
    for _ in range(3):                  # the other three slots cycle
        b = next(pipe)
        del b
    assert torch.equal(kept, copy)
    with pytest.raises(RuntimeError, match="still held"):
        next(pipe)                      # batch 4 needs the slot the kept tensor holds: an error, not a hang
    held = [next(feedline.Pipeline(data["megatron"], prefetch=4, **CONFIG))]
    p2 = feedline.Pipeline(data["megatron"], prefetch=3, **CONFIG)
    with pytest.raises(RuntimeError, match="prepare at most 3 ahead.*keep\\(\\).*copy=True.*memory_budget"):
        for _ in range(10):
            held.append(next(p2))       # keeping every batch: refused at the depth, never a hang
    del kept
    gc.collect()
    assert next(pipe).step == 4         # released: the pipeline goes on


def test_released_batch_refuses_new_tensors(data):
    pipe = feedline.Pipeline(data["megatron"], max_steps=3, **CONFIG)
    b = next(pipe)
    b.release()
    with pytest.raises(RuntimeError, match="released"):
        b.inputs
    assert [x.step for x in pipe] == [1, 2]


def test_deleting_the_pipeline_while_tensors_are_held_is_safe(data):
    pipe = feedline.Pipeline(data["megatron"], **CONFIG)
    t = next(pipe).targets
    copy = t.clone()
    del pipe
    gc.collect()
    assert torch.equal(t, copy)
    del t
    gc.collect()


def test_max_steps_ends_the_iteration_and_is_the_length(data):
    pipe = feedline.Pipeline(data["megatron"], max_steps=7, **CONFIG)
    assert len(pipe) == 7 and [b.step for b in pipe] == list(range(7))
    with pytest.raises(TypeError, match="no max_steps"):
        len(feedline.Pipeline(data["megatron"], **CONFIG))
    shown = repr(feedline.Pipeline(data["megatron"], max_steps=3, **CONFIG))
    assert shown.startswith(f"Pipeline({data['megatron']!r}, ") and "max_steps=3" in shown and "seq_len=32" in shown


def test_bad_input_raises_feedlines_error_types_with_file_and_offset(data, tmp_path):
    bad = tmp_path / "bad"
    (tmp_path / "bad.bin").write_bytes(open(data["megatron"] + ".bin", "rb").read())
    idx = bytearray(open(data["megatron"] + ".idx", "rb").read())
    idx[0:4] = b"XXXX"
    (tmp_path / "bad.idx").write_bytes(bytes(idx))
    with pytest.raises(feedline.FormatError) as e:
        feedline.Pipeline(str(bad), **CONFIG)
    assert e.value.file == str(bad) + ".idx" and e.value.offset == 0
    assert "wrong magic" in str(e.value)
    assert isinstance(e.value, feedline.Error)
    with pytest.raises(feedline.IoError) as e:
        feedline.Pipeline(str(tmp_path / "missing"), **CONFIG)
    assert e.value.file == str(tmp_path / "missing")
    with pytest.raises(feedline.ConfigError) as e:
        feedline.Pipeline(data["megatron"], **dict(CONFIG, batch_size=0))
    assert e.value.field == "batch_size"
    with pytest.raises(feedline.ConfigError):
        feedline.Pipeline(data["megatron"], mode="sideways", **{k: v for k, v in CONFIG.items()})


def test_keywords_are_checked_by_name_as_the_tools_check_their_flags(data):
    # Each keyword goes through the option's one declaration: a bad one is named, never a signature dump.
    for kwargs, field, words in [(dict(batch_sise=4), "batch_sise", "did you mean batch_size"),
                                 (dict(batch_size=-3), "batch_size", "whole number"),
                                 (dict(seq_len=1.5), "seq_len", "whole number"),
                                 (dict(workers="many"), "workers", "whole number"),
                                 (dict(tail="sideways"), "tail", "drop, pad or mask"),
                                 (dict(tokenizer=data["model"]), "text.tokenizer", "no JSONL/text")]:
        with pytest.raises(feedline.ConfigError) as e:
            feedline.Pipeline(data["megatron"], **dict(CONFIG, **kwargs))
        assert e.value.field == field, (kwargs, str(e.value))
        assert words in str(e.value), (kwargs, str(e.value))
    assert "batch_size" in feedline.PipelineOptions.__annotations__  # typed, from the same declarations


def test_a_shard_truncated_under_the_loop_is_a_format_error_from_next(data, tmp_path):
    prefix = tmp_path / "copy"
    for ext in (".bin", ".idx"):
        (tmp_path / ("copy" + ext)).write_bytes(open(data["megatron"] + ext, "rb").read())
    pipe = feedline.Pipeline(str(prefix), io_backend="mmap", **CONFIG)
    next(pipe)
    os.truncate(str(prefix) + ".bin", 4096)
    with pytest.raises(feedline.FormatError) as e:
        for _ in range(100000):
            next(pipe)
    assert e.value.file == str(prefix) + ".bin"


def test_ctrl_c_ends_a_loop_without_a_hang(data):
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, feedline
        pipe = feedline.Pipeline({data['megatron']!r}, batch_size=4, seq_len=32, workers=2, device="cpu")
        n = 0
        try:
            for b in pipe:
                n += 1
                if n == 50:
                    print("running", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
        """)], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert child.stdout.readline().strip() == "running"
    child.send_signal(signal.SIGINT)
    try:
        out, _ = child.communicate(timeout=30)  # a hang detector, not a speed bound
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail("the loop did not end after SIGINT")
    assert child.returncode == 3 and "interrupted" in out


@pytest.mark.parametrize("copy", [False, True])
def test_ctrl_c_never_loses_a_batch_the_loop_did_not_get(data, copy):
    """Hundreds of SIGINTs at random moments into a fast loop that catches KeyboardInterrupt and goes on:
    every step arrives exactly once, and state_dict() taken after each interrupt is where the loop is. (Before deliveries moved into the engine, nearly every interrupt
    that landed in Python code between taking a batch and the loop's variable lost that batch.)"""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import json, signal, torch, feedline  # torch before the signals: tensors are made with it
        pipe = feedline.Pipeline({data['megatron']!r}, max_steps=20000, batch_size=4, seq_len=32, workers=2, device="cpu", copy={copy})
        seen, interrupts, state, wrong = [], 0, {{"handling": True}}, []
        def on_sigint(sig, frame):
            if not state["handling"]:  # one arriving while the last is handled is dropped (this test's own code)
                raise KeyboardInterrupt
        signal.signal(signal.SIGINT, on_sigint)
        print("ready", flush=True)
        while True:
            try:
                state["handling"] = False
                for b in pipe:
                    seen.append(b._step)  # a slot read, no Python frame: the step is recorded once b exists
                state["handling"] = True
                break
            except KeyboardInterrupt:
                state["handling"] = True
                interrupts += 1
                if pipe.state_dict()["step"] != len(seen):  # a resume from here would skip or repeat a batch
                    wrong.append((len(seen), pipe.state_dict()["step"]))
        state["handling"] = True
        print(json.dumps({{"in_order": seen == list(range(20000)), "missing": sorted(set(range(20000)) - set(seen))[:20],
                          "extra": len(seen) - len(set(seen)), "interrupts": interrupts, "state": pipe.state_dict()["step"],
                          "wrong_states": wrong[:5]}}), flush=True)
        """)], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert child.stdout.readline().strip() == "ready"
    rng = random.Random(5)
    sent = 0
    while child.poll() is None and sent < 300:
        child.send_signal(signal.SIGINT)
        sent += 1
        time.sleep(rng.uniform(0.0005, 0.003))
    out, _ = child.communicate(timeout=120)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["interrupts"] > 10, r["interrupts"]  # the signals did land in the loop
    assert r["missing"] == [] and r["extra"] == 0 and r["in_order"] and r["state"] == 20000, r
    assert r["wrong_states"] == [], r  # state_dict() after each interrupt counts exactly the batches the loop got


def test_ctrl_c_ends_a_wait_for_late_data(data):
    """The data is late: every read of the shard takes 2 s (strace delays each pread64 of the process),
    so the first batch needs at least 2 s (~10 s here: five reads). SIGINT after 0.3 s of waiting must
    end next() with KeyboardInterrupt at once, not when the batch finally arrives."""
    import shutil
    if shutil.which("strace") is None:
        pytest.skip("strace not installed (Debian package strace)")
    child = subprocess.Popen(
        ["strace", "-f", "-qq", "-o", os.devnull, "-e", "trace=pread64", "-e", "inject=pread64:delay_enter=2s", sys.executable, "-c",
         textwrap.dedent(f"""
            import os, sys, time, feedline
            pipe = feedline.Pipeline({data['megatron']!r}, batch_size=4, seq_len=32, workers=1, device="cpu", io_backend="pread")
            print("waiting", os.getpid(), flush=True)
            t0 = time.monotonic()
            try:
                next(iter(pipe))
                print("batch", time.monotonic() - t0, flush=True)
            except KeyboardInterrupt:
                print("interrupted", time.monotonic() - t0, flush=True)
                sys.exit(3)
            """)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        first = child.stdout.readline().split()
        if not first:
            child.wait(timeout=60)
            pytest.skip("strace cannot trace here: " + child.stderr.read().strip()[-300:])
        assert first[0] == "waiting"
        time.sleep(0.3)
        os.kill(int(first[1]), signal.SIGINT)  # to Python itself, not to strace
        what, after = child.stdout.readline().split()
        child.wait(timeout=60)  # the worker's delayed reads finish before the process can end
    finally:
        if child.poll() is None:
            child.kill()
    assert what == "interrupted" and child.returncode == 3
    assert float(after) < 1.5  # one delayed read alone takes 2 s; the binding checks for signals every 100 ms


def test_a_pipeline_used_after_fork_in_the_child_says_so_instead_of_hanging(data):
    script = textwrap.dedent(f"""
        import os, sys, feedline
        pipe = feedline.Pipeline({data['megatron']!r}, batch_size=4, seq_len=32, workers=2, device="cpu")
        next(pipe)
        pid = os.fork()
        if pid == 0:
            try:
                for _ in range(100):
                    next(pipe)
                os._exit(3)
            except feedline.Error as e:
                os._exit(7 if "made before fork()" in str(e) else 4)
        _, status = os.waitpid(pid, 0)
        next(pipe)  # the parent goes on
        print("child", os.waitstatus_to_exitcode(status))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "child 7"


def test_stats_is_the_cpp_stats(data):
    pipe = feedline.Pipeline(data["megatron"], max_steps=5, **CONFIG)
    for _ in pipe:
        pass
    s = pipe.stats()
    assert s["batches"] == 5 and s["workers"] == 2 and "stall_fraction" in s and s["device"].startswith("host ring")


def test_dataloader_adapter_and_stateful_protocol(data):
    from torch.utils.data import DataLoader
    import feedline.torch as ft
    ds = ft.IterableDataset(data["megatron"], max_steps=6, **CONFIG)
    items = [{k: v.clone() for k, v in i.items()} for i in DataLoader(ds, batch_size=None, num_workers=0)]  # kept: cloned
    direct = [b.inputs.clone() for b in feedline.Pipeline(data["megatron"], max_steps=6, **CONFIG)]
    assert len(items) == 6 and all(torch.equal(i["inputs"], d) for i, d in zip(items, direct))
    state = ds.state_dict()
    again = ft.IterableDataset(data["megatron"], max_steps=8, **CONFIG)
    again.load_state_dict(state)
    rest = [i["inputs"].clone() for i in DataLoader(again, batch_size=None, num_workers=0)]
    assert len(rest) == 2


def test_dataloader_adapter_gives_new_data_every_epoch_and_refuses_worker_processes(data):
    from torch.utils.data import DataLoader
    import feedline.torch as ft
    ds = ft.IterableDataset(data["megatron"], steps_per_epoch=3, **CONFIG)
    loader = DataLoader(ds, batch_size=None, num_workers=0)
    assert len(ds) == 3 and len(loader) == 3
    epochs = [[i["inputs"].clone() for i in loader] for _ in range(3)]
    direct = [b.inputs.clone() for b in feedline.Pipeline(data["megatron"], max_steps=9, **CONFIG)]
    assert [len(e) for e in epochs] == [3, 3, 3]
    assert all(torch.equal(a, b) for a, b in zip([x for e in epochs for x in e], direct))  # the stream goes on
    assert ds.state_dict()["step"] == 9
    with pytest.raises(TypeError, match="no len"):
        len(ft.IterableDataset(data["megatron"], **CONFIG))
    with pytest.raises(RuntimeError, match="num_workers=0"):
        list(DataLoader(ft.IterableDataset(data["megatron"], max_steps=2, **CONFIG), batch_size=None, num_workers=1))


def test_torchdatas_stateful_dataloader_resumes_the_adapter_inside_an_epoch_exactly(data):
    """torchdata's StatefulDataLoader keeps the adapter's state in its own state_dict() (the Stateful
    protocol): a run stopped inside its second epoch and restored in a new loader gives the batches of an
    uninterrupted run, finishing that epoch where it would have ended, without replaying any. The plain
    DataLoader with the adapter's own state_dict() resumes the same way."""
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    import feedline.torch as ft
    def loader(kind):
        ds = ft.IterableDataset(data["megatron"], steps_per_epoch=5, copy=True, **CONFIG)
        return ds, kind(ds, batch_size=None, num_workers=0)
    _, whole = loader(sdl.StatefulDataLoader)
    reference = [[i["inputs"] for i in whole] for _ in range(3)]
    assert [len(e) for e in reference] == [5, 5, 5]
    for kind in (sdl.StatefulDataLoader, torch.utils.data.DataLoader):
        ds, first = loader(kind)
        got = [[i["inputs"] for i in first]]
        it = iter(first)
        got.append([next(it)["inputs"] for _ in range(2)])
        state = first.state_dict() if kind is sdl.StatefulDataLoader else ds.state_dict()
        assert (state["dataset_state"] if kind is sdl.StatefulDataLoader else state)["step"] == 7
        del it, first, ds
        ds, second = loader(kind)
        (second if kind is sdl.StatefulDataLoader else ds).load_state_dict(state)
        got[1] += [i["inputs"] for i in second]  # the rest of the second epoch: 3 batches
        got.append([i["inputs"] for i in second])
        assert [len(e) for e in got] == [5, 5, 5], kind
        assert all(torch.equal(a, b) for ea, eb in zip(got, reference) for a, b in zip(ea, eb)), kind


def test_set_epoch_starts_at_that_epochs_first_batch_and_the_adapter_passes_over_that_epoch(data):
    per = len(feedline.Pipeline(data["megatron"], epochs=1, **CONFIG))
    whole = [(b.step, b.epoch, b.inputs.clone()) for b in feedline.Pipeline(data["megatron"], max_steps=3 * per, **CONFIG)]
    pipe = feedline.Pipeline(data["megatron"], max_steps=3 * per, **CONFIG)
    pipe.set_epoch(2)
    got = [(b.step, b.epoch, b.inputs.clone()) for b in pipe]
    assert [s for s, _, _ in got] == list(range(2 * per, 3 * per))  # the run still ends at max_steps
    assert all(e == 2 for _, e, _ in got)
    assert all(torch.equal(a[2], b[2]) for a, b in zip(got, whole[2 * per:]))
    # Packed rows: epochs of different lengths, each started where a whole run gets to it.
    packed = dict(CONFIG, mode="packed")
    three = [(b.epoch, b.inputs.clone()) for b in feedline.Pipeline(data["megatron"], epochs=3, **packed)]
    later = feedline.Pipeline(data["megatron"], epochs=3, **packed)
    later.set_epoch(1)
    rest = [(b.epoch, b.inputs.clone()) for b in later]
    expected = [x for x in three if x[0] >= 1]
    assert len(rest) == len(expected) > 0
    assert all(a[0] == b[0] and torch.equal(a[1], b[1]) for a, b in zip(rest, expected))
    # Only before the first batch, one dataset, a whole number.
    started = feedline.Pipeline(data["megatron"], max_steps=4, **CONFIG)
    next(started)
    with pytest.raises(feedline.ConfigError, match="before the first"):
        started.set_epoch(1)
    with pytest.raises(feedline.ConfigError, match="blend"):
        feedline.Pipeline(f"0.5 {data['megatron']} 0.5 {data['llmc']}", max_steps=4, **CONFIG).set_epoch(1)
    with pytest.raises(TypeError, match="epoch must be"):
        feedline.Pipeline(data["megatron"], max_steps=4, **CONFIG).set_epoch("1")
    with pytest.raises(ValueError, match="epoch must be"):
        feedline.Pipeline(data["megatron"], max_steps=4, **CONFIG).set_epoch(-1)
    # The DataLoader adapter, as with DistributedSampler.set_epoch: each pass is the epoch set.
    from torch.utils.data import DataLoader
    import feedline.torch as ft
    ds = ft.IterableDataset(data["megatron"], **CONFIG)
    loader = DataLoader(ds, batch_size=None, num_workers=0)
    for n in (1, 0, 2):
        ds.set_epoch(n)
        items = [i["inputs"].clone() for i in loader]
        assert len(items) == per
        assert all(torch.equal(a, b[2]) for a, b in zip(items, whole[n * per:(n + 1) * per]))
    assert ds.state_dict()["step"] == 3 * per  # the end of epoch 2
    # A checkpoint taken inside an epoch: the usual loop (load_state_dict, then set_epoch before each
    # pass) goes on from it, not from the epoch's first batch again.
    ds = ft.IterableDataset(data["megatron"], **CONFIG)
    ds.set_epoch(1)
    it = iter(DataLoader(ds, batch_size=None, num_workers=0))
    for _ in range(2):
        next(it)
    saved = ds.state_dict()
    resumed = ft.IterableDataset(data["megatron"], **CONFIG)
    resumed.load_state_dict(saved)
    resumed.set_epoch(1)
    items = [i["inputs"].clone() for i in DataLoader(resumed, batch_size=None, num_workers=0)]
    assert len(items) == per - 2
    assert all(torch.equal(a, b[2]) for a, b in zip(items, whole[per + 2:2 * per]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU (torch.cuda.is_available() is False)")
def test_gpu_tensors_are_on_the_device_and_correct(data):
    host = [b.inputs.clone() for b in feedline.Pipeline(data["megatron"], max_steps=5, **CONFIG)]
    pipe = feedline.Pipeline(data["megatron"], max_steps=5, **dict(CONFIG, device="cuda"))
    for b, h in zip(pipe, host):
        assert b.inputs.device.type == "cuda"
        torch.cuda.synchronize()
        assert torch.equal(b.inputs.cpu(), h)
        assert b.inputs.device.index == torch.cuda.current_device()  # "cuda": torch's current device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU (torch.cuda.is_available() is False)")
def test_gpu_batches_kept_and_copied_stay_on_the_device_and_equal_the_host_run(data):
    host = [(b.inputs.clone(), b.targets.clone()) for b in feedline.Pipeline(data["megatron"], max_steps=12, **CONFIG)]
    gpu = dict(CONFIG, device="cuda")
    # copy=True: every batch kept as it arrives, far more than the ring's slots.
    pipe = feedline.Pipeline(data["megatron"], max_steps=12, prefetch=2, copy=True, **gpu)
    copied = list(pipe)
    # keep(): k micro-batches held at once, the slot returned as each is kept.
    kept = []
    pipe2 = feedline.Pipeline(data["megatron"], max_steps=12, prefetch=2, **gpu)
    for _ in range(3):
        kept += [next(pipe2).keep() for _ in range(4)]
    torch.cuda.synchronize()
    assert pipe.stats()["slots"] < 12 and len(copied) == len(kept) == 12
    for c, k, (x, y) in zip(copied, kept, host):
        for b in (c, k):
            assert b.kept and b.inputs.device.type == "cuda" and b.targets.device.type == "cuda"
            assert torch.equal(b.inputs.cpu(), x) and torch.equal(b.targets.cpu(), y)


def test_auto_and_cuda_follow_torch_only_once_torch_has_set_up_cuda(data):
    from feedline import _torch_device
    assert _torch_device("cpu") == "cpu" and _torch_device("cuda:1") == "cuda:1"  # named devices stay as named
    if not torch.cuda.is_initialized():  # nothing has chosen a device: feedline resolves it itself
        assert _torch_device("auto") == "auto" and _torch_device("cuda") == "cuda"
    else:
        assert _torch_device("cuda") == f"cuda:{torch.cuda.current_device()}"
    if feedline._feedline.cuda_devices() == 0:  # auto on a machine without a GPU (for feedline): host tensors
        b = next(iter(feedline.Pipeline(data["megatron"], max_steps=1, **dict(CONFIG, device="auto"))))
        assert b.inputs.device.type == "cpu"


def test_tokenizer_gives_sentencepieces_own_ids_with_either_encoder(data):
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=data["model"])
    with open(data["jsonl"], encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    texts += ["", "   ", "東京 🙂 naïve café", "\x00\x01 tab\there\r\n", "ｆｕｌｌ ｗｉｄｔｈ ﬁ ①", "x" * 5000]
    want = [sp.encode(t) for t in texts]
    for kind in ("sentencepiece", "feedline"):
        tok = feedline.Tokenizer(data["model"], kind=kind)
        assert tok.kind == kind and tok.vocab_size == sp.get_piece_size()
        assert [tok.encode(t) for t in texts] == want
        assert tok.encode_batch(texts, threads=3) == want
        assert tok.encode_batch([]) == []
    with_eos = feedline.Tokenizer(data["model"], kind="feedline", add_eos=True)
    assert with_eos.encode("one two") == sp.encode("one two") + [sp.eos_id()]
    # kind auto takes feedline's encoder for a Unigram model, and a BPE one, with the library's ids
    chosen = feedline.Tokenizer(data["model"])
    assert (chosen.kind, chosen.description, chosen.chosen_because) == ("feedline", "feedline's Unigram encoder", "")
    bpe_prefix = str(data["dir"] / "bpe")
    sentencepiece.SentencePieceTrainer.train(input=data["jsonl"], model_prefix=bpe_prefix,
                                             model_type="bpe", vocab_size=300, hard_vocab_limit=False, minloglevel=2)
    bpe = feedline.Tokenizer(bpe_prefix + ".model")
    assert bpe.description == "feedline's BPE encoder"
    sp_bpe = sentencepiece.SentencePieceProcessor(model_file=bpe_prefix + ".model")
    assert bpe.encode_batch(texts, threads=2) == [sp_bpe.encode(t) for t in texts]
    with pytest.raises(feedline.ConfigError, match="missing.model"):
        feedline.Tokenizer(str(data["dir"] / "missing.model"))
    # Wrong types name the argument (not the extension's signature).
    for call, message in [(lambda: feedline.Tokenizer(data["model"], add_bos="yes"), "add_bos must be True or False, not str 'yes'"),
                          (lambda: feedline.Tokenizer(3), "model must be a path"),
                          (lambda: feedline.Tokenizer(data["model"], kind=None), "kind must be a string"),
                          (lambda: chosen.encode(b"bytes"), "text must be a str, not bytes"),
                          (lambda: chosen.encode_batch(["a", 5]), r"texts\[1\] must be a str"),
                          (lambda: chosen.encode_batch(["a"], threads=1.5), "threads must be a whole number")]:
        with pytest.raises(TypeError, match=message):
            call()
    with pytest.raises(ValueError, match="threads must be >= 0"):
        chosen.encode_batch(["a"], threads=-1)


def test_kept_batches_can_be_held_without_limit_and_equal_the_zero_copy_ones(data):
    direct = [(b.inputs.clone(), b.targets.clone()) for b in feedline.Pipeline(data["megatron"], max_steps=12, **CONFIG)]
    # list() over a finite pipeline, far more batches than the ring's slots.
    pipe = feedline.Pipeline(data["megatron"], max_steps=12, prefetch=2, copy=True, **CONFIG)
    held = list(pipe)
    assert len(held) == 12 and all(b.kept for b in held) and pipe.stats()["slots"] < 12
    assert all(torch.equal(b.inputs, x) and torch.equal(b.targets, y) for b, (x, y) in zip(held, direct))
    assert "copy=True" in repr(pipe)
    # Gradient accumulation: k micro-batches held at once, kept one by one.
    pipe = feedline.Pipeline(data["megatron"], max_steps=12, prefetch=2, **CONFIG)
    for group in range(3):
        micro = [next(pipe).keep() for _ in range(4)]
        assert [m.step for m in micro] == list(range(4 * group, 4 * group + 4))
        for m in micro:
            assert torch.equal(m.inputs, direct[m.step][0])
    # A packed batch's extra tensors come along; keep() twice is harmless; a released batch cannot be kept.
    b = next(feedline.Pipeline(data["megatron"], mode="packed", max_steps=2, **CONFIG))
    positions = b.positions.clone()
    assert b.keep() is b and b.keep() is b and torch.equal(b.positions, positions) and b.cu_seqlens is not None
    r = next(feedline.Pipeline(data["megatron"], max_steps=2, **CONFIG))
    r.release()
    with pytest.raises(RuntimeError, match="released before keep"):
        r.keep()
    with pytest.raises(TypeError, match="copy must be True or False"):
        feedline.Pipeline(data["megatron"], copy="yes", **CONFIG)


def test_dataloader_batch_size_k_over_the_adapter_works_with_copy_and_says_so_without(data):
    from torch.utils.data import DataLoader
    import feedline.torch as ft
    direct = [b.inputs.clone() for b in feedline.Pipeline(data["megatron"], max_steps=12, **CONFIG)]
    loader = DataLoader(ft.IterableDataset(data["megatron"], max_steps=12, prefetch=2, copy=True, **CONFIG), batch_size=6, num_workers=0)
    stacked = [i["inputs"] for i in loader]
    assert [tuple(x.shape) for x in stacked] == [(6, 4, 32), (6, 4, 32)]
    assert all(torch.equal(stacked[k // 6][k % 6], direct[k]) for k in range(12))
    with pytest.raises(RuntimeError, match="give it copy=True"):
        list(DataLoader(ft.IterableDataset(data["megatron"], max_steps=12, prefetch=2, **CONFIG), batch_size=6, num_workers=0))


def write_nanogpt_bin(path, documents=300, seed=3):
    """A file as nanoGPT's prepare.py writes it: GPT-2 ids of every document followed by <|endoftext|>
    (50256), concatenated into a uint16 np.memmap, with no header."""
    import numpy as np
    rng = np.random.default_rng(seed)
    ids = []
    for _ in range(documents):
        ids.extend(rng.integers(0, 50256, int(rng.integers(1, 200))).tolist())
        ids.append(50256)
    arr = np.memmap(path, dtype=np.uint16, mode="w+", shape=(len(ids),))
    arr[:] = ids
    arr.flush()
    return torch.tensor(ids, dtype=torch.int64)


def test_nanogpts_train_bin_is_read_as_raw_uint16_tokens(tmp_path):
    tokens = write_nanogpt_bin(tmp_path / "train.bin")
    spec = f"raw:uint16:{tmp_path / 'train.bin'}"
    pipe = feedline.Pipeline(spec, shuffle="none", max_steps=6, rank=0, world_size=1, **CONFIG)
    for b in pipe:
        for r in range(4):
            k = b.step * 4 + r  # row k is tokens [32k, 32k + 32) of the file, and its targets the next ones
            assert torch.equal(b.inputs[r].long(), tokens[32 * k:32 * k + 32])
            assert torch.equal(b.targets[r].long(), tokens[32 * k + 1:32 * k + 33])
    shuffled = feedline.Pipeline(spec, max_steps=20, **CONFIG)
    total = sum(int(b.inputs.to(torch.int64).sum()) for b in shuffled)
    cpp = iterate(spec, *cli_args(20))
    assert total == cpp["token_sum"] and shuffled.state_dict() == cpp["state"]
    # Packed: every document ends with its own <|endoftext|>, so an end-of-text is always a piece's last token.
    for b in feedline.Pipeline(spec, mode="packed", max_steps=5, **CONFIG):
        x, pos = b.inputs, b.positions
        for r in range(4):
            for t in range(31):
                if int(x[r, t]) == 50256:
                    assert int(pos[r, t + 1]) == 0
    info = json.loads(subprocess.run([str(os.environ["FEEDLINE_BIN_DIR"] + "/feedline-inspect"), "--json", spec],
                                     capture_output=True, text=True, check=True).stdout)
    assert info["format"] == "raw" and info["tokens"] == len(tokens) and info["delimiter"] == 50256
    # Another tokenizer's end-of-text, named in the spec (Python, the tools and blends take it alike):
    # uint32 ids with 2 ending every document.
    import numpy as np
    rng = np.random.default_rng(5)
    ids = np.concatenate([np.append(rng.integers(10, 100000, int(rng.integers(1, 40))), 2) for _ in range(400)]).astype(np.uint32)
    ids.tofile(tmp_path / "other.bin")
    eot = 2
    named = f"raw:uint32:eot={eot}:{tmp_path / 'other.bin'}"
    seen = 0
    for b in feedline.Pipeline(named, mode="packed", max_steps=5, **CONFIG):
        for r in range(4):
            for t in range(31):
                if int(b.inputs[r, t]) == eot:
                    assert int(b.positions[r, t + 1]) == 0
                    seen += 1
    assert seen > 0
    info = json.loads(subprocess.run([str(os.environ["FEEDLINE_BIN_DIR"] + "/feedline-inspect"), "--json", named],
                                     capture_output=True, text=True, check=True).stdout)
    assert info["delimiter"] == eot


def test_raw_files_with_a_partial_token_or_a_bad_spec_are_refused_naming_them(tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02\x00\x03")
    with pytest.raises(feedline.FormatError, match="not a whole number of uint16 tokens") as e:
        feedline.Pipeline(f"raw:uint16:{tmp_path / 'odd.bin'}", **CONFIG)
    assert e.value.file == str(tmp_path / "odd.bin") and e.value.offset == 4
    with pytest.raises(feedline.ConfigError, match="raw:<dtype>:<path>"):
        feedline.Pipeline(f"raw:float32:{tmp_path / 'odd.bin'}", **CONFIG)
    with pytest.raises(feedline.ConfigError, match="eot=x is not a token id"):
        feedline.Pipeline(f"raw:uint16:eot=x:{tmp_path / 'odd.bin'}", **CONFIG)
    with pytest.raises(feedline.IoError, match="missing.bin"):
        feedline.Pipeline(f"raw:uint16:{tmp_path / 'missing.bin'}", **CONFIG)


def test_raw_files_in_s3_give_the_local_files_batches(s3, tmp_path):
    write_nanogpt_bin(tmp_path / "train.bin")
    sign = ["--aws-sigv4", "aws:amz:us-east-1:s3", "--user", "feedline:feedline-secret", "--fail", "--silent", "--show-error"]
    subprocess.run(["curl", *sign, "-T", str(tmp_path / "train.bin"), f"{s3['endpoint']}/python-tests/raw/train.bin"], check=True)
    local = feedline.Pipeline(f"raw:uint16:{tmp_path / 'train.bin'}", max_steps=10, **CONFIG)
    remote = feedline.Pipeline("raw:uint16:s3://python-tests/raw/train.bin", max_steps=10, **CONFIG)
    for a, b in zip(local, remote, strict=True):
        assert torch.equal(a.inputs, b.inputs)
    assert remote.state_dict() == local.state_dict()


def test_nanogpt_example_trains_on_nanogpts_own_file(tmp_path):
    write_nanogpt_bin(tmp_path / "train.bin", documents=100)
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "nanogpt_feed.py")
    r = subprocess.run([sys.executable, example, "--data", f"raw:uint16:{tmp_path / 'train.bin'}", "--steps", "4", "--batch-size", "4",
                        "--block-size", "32", "--vocab", "50304", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "in 4 steps on cpu" in r.stdout


def test_documents_tokenized_in_python_are_written_as_a_dataset_and_read_back(tmp_path):
    import numpy as np
    rng = np.random.default_rng(11)
    docs = [rng.integers(0, 50000, int(rng.integers(0, 120))) for _ in range(200)]
    forms = [docs[0].tolist(), torch.from_numpy(docs[1])] + docs[2:]  # lists, tensors and numpy arrays alike
    paths = feedline.write(tmp_path / "web", forms, vocab_size=50257)
    assert paths == [str(tmp_path / "web")]
    info = json.loads(subprocess.run([os.environ["FEEDLINE_BIN_DIR"] + "/feedline-inspect", "--json", paths[0]],
                                     capture_output=True, text=True, check=True).stdout)
    assert info["format"] == "megatron" and info["dtype"] == "uint16" and info["documents"] == 200
    assert info["tokens"] == sum(len(d) for d in docs)
    stream = torch.from_numpy(np.concatenate(docs).astype(np.int64))
    for b in feedline.Pipeline(paths[0], shuffle="none", max_steps=4, rank=0, world_size=1, **CONFIG):
        for r in range(4):
            k = b.step * 4 + r
            assert torch.equal(b.inputs[r].long(), stream[32 * k:32 * k + 32])
    # llm.c shards, ids beyond uint16: uint32 from the vocabulary, each document led by the delimiter.
    with feedline.Writer(tmp_path / "big", format="llmc", vocab_size=128256, shard_bytes=4096) as w:
        for d in docs:
            w.add(d + 70000)
    assert w.dtype == "uint32" and w.documents == 200 and len(w.paths) > 1
    info = json.loads(subprocess.run([os.environ["FEEDLINE_BIN_DIR"] + "/feedline-inspect", "--json", str(tmp_path / "big_*.bin")],
                                     capture_output=True, text=True, check=True).stdout)
    assert info["format"] == "llmc" and info["dtype"] == "uint32" and info["delimiter"] == 128000 and info["documents"] == 200


def test_a_failed_write_leaves_no_dataset_and_a_second_writer_is_refused(tmp_path):
    with pytest.raises(feedline.ConfigError, match="token 70000 does not fit uint16 \\(document 2\\)"):
        feedline.write(tmp_path / "web", [[1, 2], [3], [70000]])
    with pytest.raises(TypeError, match="document 1: expected a 1-D sequence of integer token ids"):
        feedline.write(tmp_path / "web", [[1, 2], [0.5, 1.5]])
    with pytest.raises(KeyboardInterrupt):
        with feedline.Writer(tmp_path / "web", format="llmc") as w:
            w.add([1, 2, 3])
            raise KeyboardInterrupt
    assert sorted(os.listdir(tmp_path)) == []  # no dataset, no temporary file, no lock
    first = feedline.Writer(tmp_path / "web")
    with pytest.raises(feedline.IoError, match="lock"):
        feedline.Writer(tmp_path / "web")
    first.add([5, 6])
    assert first.finish() == [str(tmp_path / "web")]
    with pytest.raises(RuntimeError, match="finished"):
        first.add([1])
    with pytest.raises(ValueError, match="format must be"):
        feedline.Writer(tmp_path / "x", format="parquet")
    with pytest.raises(ValueError, match="give delimiter="):
        feedline.Writer(tmp_path / "x", format="llmc", vocab_size=32000)
    assert feedline.Writer(tmp_path / "y", vocab_size=65500).dtype == "int32"  # as feedline-pack: uint16 below 65500


def test_pack_from_python_writes_what_feedline_pack_writes(data, tmp_path):
    seen = []
    r = feedline.pack(data["jsonl"], tmp_path / "corpus", Path(data["model"]), append_eos=True, progress=seen.append)
    assert r["written"] == [str(tmp_path / "corpus")] and r["documents"] == 300 and r["tokens"] > 0
    for ext in (".bin", ".idx"):  # byte for byte what the fixture's feedline-pack wrote
        assert (tmp_path / ("corpus" + ext)).read_bytes() == Path(data["megatron"] + ext).read_bytes()
    assert seen and seen[-1]["documents"] == 300 and seen[-1]["tokens"] == r["tokens"]
    assert all(a["documents"] <= b["documents"] for a, b in zip(seen, seen[1:]))
    r = feedline.pack([data["jsonl"]], tmp_path / "shard", data["model"], format="llmc", append_eos=True, shard_bytes=40000,
                      threads=3, progress=False)
    fixture = sorted(data["dir"].glob("shard_*.bin"))
    assert [Path(p).name for p in r["written"]] == [p.name for p in fixture]
    assert all(Path(a).read_bytes() == b.read_bytes() for a, b in zip(r["written"], fixture))


def test_pack_from_python_refuses_bad_input_and_leaves_nothing_when_stopped(data, tmp_path):
    def interrupt(progress):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while documents are written
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(KeyboardInterrupt):
        feedline.pack(data["jsonl"], out / "corpus", data["model"], progress=interrupt)
    def fail(progress):
        raise ValueError("from the callback")
    with pytest.raises(ValueError, match="from the callback"):
        feedline.pack(data["jsonl"], out / "corpus", data["model"], progress=fail)
    assert os.listdir(out) == []  # no dataset, no temporary file, no lock
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 3}\n')
    with pytest.raises(feedline.FormatError, match="line 2") as e:
        feedline.pack(bad, out / "bad", data["model"], progress=False)
    assert e.value.file == str(bad) and e.value.offset == 17
    r = feedline.pack(bad, out / "skipped", data["model"], skip_invalid=True, progress=False)
    assert r["documents"] == 1 and r["skipped"] == 1
    with pytest.raises(TypeError, match="unknown option.*batch_size"):
        feedline.pack(bad, out / "x", data["model"], batch_size=3)
    with pytest.raises(feedline.IoError, match="missing.jsonl"):
        feedline.pack(tmp_path / "missing.jsonl", out / "x", data["model"], progress=False)


def test_the_packages_console_commands_run_its_own_tools(data, tmp_path):
    """feedline-pack, -inspect, -iterate and -doctor come with the package (next to its Python), run the
    tools it carries, and do what the CMake build's tools do: the same bytes, the same batches, the tool's
    own exit status and messages."""
    scripts = Path(sys.executable).parent
    def run(name, *args):
        return subprocess.run([str(scripts / name), *args], capture_output=True, text=True, timeout=120)
    for name in ("feedline-pack", "feedline-inspect", "feedline-iterate", "feedline-doctor"):
        assert (scripts / name).exists(), f"{name} was not installed with the package"
        r = run(name, "--help")
        assert r.returncode == 0 and "Usage" in r.stdout, (name, r.stderr)
    r = run("feedline-pack", "--quiet", "--append-eos", "--input", data["jsonl"], "--model", data["model"],
            "--output", str(tmp_path / "corpus"))
    assert r.returncode == 0, r.stderr
    for ext in (".bin", ".idx"):  # byte for byte what the fixture's feedline-pack (the CMake build's) wrote
        assert (tmp_path / ("corpus" + ext)).read_bytes() == Path(data["megatron"] + ext).read_bytes()
    r = run("feedline-iterate", str(tmp_path / "corpus"), *cli_args(6))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["token_sum"] == iterate(data["megatron"], *cli_args(6))["token_sum"]
    r = run("feedline-inspect", "--json", str(tmp_path / "corpus"))
    assert r.returncode == 0 and json.loads(r.stdout)["documents"] == 300, r.stderr
    r = run("feedline-inspect", str(tmp_path / "missing"))  # the tool's own error and status, not Python's
    assert r.returncode != 0 and "missing" in r.stderr and "Traceback" not in r.stderr
    r = run("feedline-doctor", "plan", "--params", "1e9", "--gpus", "8", "--gpu-memory", "80GiB", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["fits"] is True, r.stderr
    # A package built without a tool says which and why, with the shell's "not found" status.
    r = subprocess.run([sys.executable, "-c", "import sys; from feedline import _cli; sys.argv = ['x']; _cli._run('feedline-none')"],
                       capture_output=True, text=True)
    assert r.returncode == 127 and "feedline-none: not in this feedline package" in r.stderr


def test_the_installed_package_is_a_manylinux_wheel_that_needs_no_build_tools_or_source_tree():
    """What scripts/install-python.sh installs is the repaired wheel: the module and the tools load the
    shared libraries bundled in it (feedline.libs), nothing is imported from the source tree, and (in the
    project's test run, FEEDLINE_TEST_NO_BUILD_TOOLS=1) no compiler, linker or CMake is on PATH."""
    import importlib.metadata
    import shutil
    root = Path(__file__).resolve().parents[2]
    package = Path(feedline.__file__).resolve().parent
    assert "site-packages" in package.parts and package != root / "python" / "feedline", f"not the installed package: {package}"
    wheel = (Path(importlib.metadata.distribution("feedline")._path) / "WHEEL").read_text()
    assert "manylinux_" in wheel, wheel
    maps = Path("/proc/self/maps").read_text()
    bundled = package.parent / "feedline.libs"
    assert f"{bundled}/libsentencepiece-" in maps and f"{bundled}/liburing-" in maps
    for tool in ("feedline-pack", "feedline-doctor"):
        ldd = subprocess.run(["ldd", str(package / "bin" / tool)], capture_output=True, text=True).stdout
        assert f"{package}/bin/../../feedline.libs/" in ldd and "not found" not in ldd, ldd  # their RPATH: $ORIGIN/../../feedline.libs
    if os.environ.get("FEEDLINE_TEST_NO_BUILD_TOOLS") == "1":
        assert [t for t in ("cc", "c++", "gcc", "g++", "clang", "cmake", "make", "ld") if shutil.which(t)] == []


def test_an_evaluation_pass_has_every_window_once_and_a_length(data):
    """shuffle="none", tail="mask", epochs=1: every window of the data once, in order, across the ranks;
    the last batch's extra rows have targets -100 (what cross_entropy ignores); len() is the pass's steps."""
    import struct
    from conftest import bin_dir
    spec = data["megatron"]
    dumped = subprocess.run([str(bin_dir() / "feedline-inspect"), "--dump-tokens", spec], capture_output=True, check=True).stdout
    tokens = list(struct.unpack(f"<{len(dumped) // 4}I", dumped))
    T, B = CONFIG["seq_len"], 4
    windows = (len(tokens) - 1) // T
    assert windows % B  # the pass ends in a partial batch
    for world in (1, 2):
        seen = {}
        for rank in range(world):
            pipe = feedline.Pipeline(spec, shuffle="none", tail="mask", epochs=1, rank=rank, world_size=world,
                                     **dict(CONFIG, batch_size=B // world))
            assert len(pipe) == (windows + B - 1) // B
            for b in pipe:
                for r, (x, y) in enumerate(zip(b.inputs.tolist(), b.targets.tolist())):
                    g = b.step * B + rank * (B // world) + r  # the global sample this row is
                    seen[g] = (x, y)
        assert sorted(seen) == list(range(len(pipe) * B))
        for g, (x, y) in seen.items():
            if g < windows:
                assert x == tokens[g * T:(g + 1) * T] and y == tokens[g * T + 1:(g + 1) * T + 1]
            else:
                assert y == [-100] * T  # padding: nothing counts
    with pytest.raises(feedline.ConfigError, match="epochs"):
        feedline.Pipeline(f"0.5 {spec} 0.5 {spec}", epochs=1, **CONFIG)
    assert len(feedline.Pipeline(spec, epochs=3, max_steps=5, **CONFIG)) == 5
    import feedline.torch as ft
    ds = ft.IterableDataset(spec, shuffle="none", tail="mask", epochs=1, rank=0, world_size=1, **CONFIG)
    assert len(ds) == (windows + B - 1) // B == sum(1 for _ in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0))
