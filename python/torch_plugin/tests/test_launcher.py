"""enable() and `python -m bucketalloc_torch` against a fake torch that records every call.

The fake (tests/fake_torch) is on the PYTHONPATH of the child processes only. It checks what real
PyTorch checks (the library loads and exports the named functions; setters take ints) and raises
"Can't swap an already initialized allocator" on demand.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from helpers import FAKE_TORCH, child_env, expect_success, run, run_python

# The hook setters enable() calls, in order, and the library function each gets.
HOOK_FUNCTIONS = {
    "set_init_fn": "bucketalloc_init",
    "set_reset_fn": "bucketalloc_empty_cache",
    "set_memory_fraction_fn": "bucketalloc_set_memory_fraction",
    "set_record_stream_fn": "bucketalloc_record_stream",
    "set_base_alloc_fn": "bucketalloc_base_alloc",
    "set_begin_allocate_to_pool": "bucketalloc_torch_begin_allocate_to_pool",
    "set_end_allocate_to_pool_fn": "bucketalloc_torch_end_allocate_to_pool",
    "set_release_pool": "bucketalloc_torch_release_pool",
}
# What one enable() does to torch, in order.
ENABLE_CALLS = ["CUDAPluggableAllocator", *HOOK_FUNCTIONS, "change_current_allocator"]

# A program for the launcher: prints what it saw as JSON. Its first line reads the fake's log, so
# the log shows what had happened to torch before the program started.
PROGRAM = """\
import torch._fake; log_at_start = [list(entry) for entry in torch._fake.log]
import json, sys
import bucketalloc_torch
from bucketalloc_torch import _lib
print(json.dumps({
    "argv": sys.argv,
    "name": __name__,
    "path0": sys.path[0],
    "log_at_start": log_at_start,
    "config": bucketalloc_torch.config().split(","),
    "library": _lib.library_path(),
    "addresses": {name: _lib.function_address(name) for name in %r},
}))
""" % sorted(HOOK_FUNCTIONS.values())


def launch(*args: str, cwd=None, conf=None, **env: str) -> subprocess.CompletedProcess:
    """Runs `python -m bucketalloc_torch args...` with the fake torch (any exit status)."""
    return run(["-m", "bucketalloc_torch", *args], child_env(conf, [FAKE_TORCH], **env), cwd=cwd)


def run_with_fake_torch(code: str, conf: str = "backend:sim", **env: str) -> subprocess.CompletedProcess:
    """Runs `code` with the fake torch on the path; fails unless it exits 0."""
    return run_python(code, conf=conf, extra_path=[FAKE_TORCH], **env)


@pytest.fixture
def program(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "program.py"
    path.write_text(PROGRAM)
    return path


def check_enable_calls(seen: dict) -> None:
    """Checks that the program started after one complete enable() that used this library."""
    log = seen["log_at_start"]
    assert [entry[0] for entry in log] == ENABLE_CALLS
    assert log[0] == ["CUDAPluggableAllocator", seen["library"], "bucketalloc_malloc_or_throw", "bucketalloc_free"]
    for setter, pointer in log[1:-1]:
        assert pointer == seen["addresses"][HOOK_FUNCTIONS[setter]], setter


# ---- the launcher -----------------------------------------------------------------------------


def test_launcher_enables_then_runs_the_script(program):
    seen = json.loads(expect_success(launch("--conf", "backend:sim,capacity:64MiB", str(program), "a", "b")).stdout)
    assert seen["argv"] == [str(program), "a", "b"]
    assert seen["name"] == "__main__"
    assert seen["path0"] == str(program.parent)
    check_enable_calls(seen)
    assert "capacity:64MiB" in seen["config"]


def test_launcher_pluggable_installs_through_torchs_pluggable_allocator_without_trying_the_native_path(program):
    process = expect_success(launch("--pluggable", "--conf", "backend:sim", str(program)))
    seen = json.loads(process.stdout)
    check_enable_calls(seen)
    assert "native allocator cannot be built" not in process.stderr, process.stderr


def test_launcher_without_pluggable_says_why_the_native_path_is_not_taken(program):
    # The fake torch has no C++ headers: enable() falls back to the pluggable path, saying so.
    process = expect_success(launch("--conf", "backend:sim", str(program)))
    check_enable_calls(json.loads(process.stdout))
    assert "the native allocator cannot be built" in process.stderr and "C++ headers" in process.stderr, process.stderr


def test_launcher_leaves_options_after_the_script_to_it(program):
    seen = json.loads(expect_success(launch("--conf=backend:sim", str(program), "--conf", "x", "-m", "y")).stdout)
    assert seen["argv"] == [str(program), "--conf", "x", "-m", "y"]
    assert "capacity:0" in seen["config"]


def test_launcher_runs_a_module(tmp_path):
    (tmp_path / "program_module.py").write_text(PROGRAM)
    seen = json.loads(expect_success(launch("--conf", "backend:sim", "-m", "program_module", "x", "-q",
                                            cwd=tmp_path)).stdout)
    assert seen["argv"] == [str(tmp_path / "program_module.py"), "x", "-q"]
    assert seen["name"] == "__main__"
    check_enable_calls(seen)


def test_launcher_takes_the_conf_from_the_environment(program):
    seen = json.loads(expect_success(launch(str(program), conf="backend:sim,capacity:32MiB")).stdout)
    assert "capacity:32MiB" in seen["config"]
    check_enable_calls(seen)


def test_launcher_patch_torch(tmp_path):
    script = tmp_path / "patched.py"
    script.write_text(
        """\
import torch, bucketalloc_torch as ba
from bucketalloc_torch import _lib
p = _lib.lib().bucketalloc_malloc(3 << 20, 0, None)
for module in (torch.cuda, torch.cuda.memory):
    assert module.memory_stats is ba.memory_stats
    assert module.memory_allocated() == 3 << 20
    assert module.max_memory_allocated() == 3 << 20
    assert module.memory_reserved() == module.max_memory_reserved() == 20 << 20
    assert "bucketalloc memory summary" in module.memory_summary()
    assert module.memory_snapshot()[0]["total_size"] == 20 << 20
torch.cuda.reset_peak_memory_stats()
torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=10)
_lib.lib().bucketalloc_free(p, 3 << 20, 0, None)
snapshot = torch.cuda.memory._snapshot()
assert [e["action"] for e in snapshot["device_traces"][0]] == ["free_requested", "free_completed"]
torch.cuda.memory._dump_snapshot("%s")
ba.unpatch_torch()
for module in (torch.cuda, torch.cuda.memory):
    try:
        module.memory_stats()
    except RuntimeError as e:
        assert "does not yet support" in str(e)
    else:
        raise AssertionError("memory_stats is still patched")
assert torch.cuda.memory._snapshot is not ba.snapshot
print("ok")
"""
        % (tmp_path / "dump.pickle")
    )
    process = expect_success(launch("--conf", "backend:sim", "--patch-torch", str(script)))
    assert process.stdout == "ok\n"
    assert (tmp_path / "dump.pickle").stat().st_size > 0


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "the script to run (or -m module) is missing"),
        (["--conf", "backend:sim"], "the script to run (or -m module) is missing"),
        (["no_such_script.py"], "can't open file 'no_such_script.py': no such file"),
        (["-m"], "-m needs a module name"),
        (["-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
        (["--bogus", "script.py"], "unknown option '--bogus'"),
        (["--"], "the script to run is missing after --"),
        (["--conf"], "argument --conf: expected one argument"),
    ],
)
def test_launcher_usage_errors(args, message):
    process = launch(*args)
    assert process.returncode == 2, process
    assert "usage: python -m bucketalloc_torch [--conf CONF] [--pluggable] [--patch-torch] (script.py | -m module)" in process.stderr
    assert message in process.stderr, process.stderr


def test_launcher_help():
    process = launch("--help")
    assert process.returncode == 0
    assert "--patch-torch" in process.stdout and "BUCKETALLOC_CONF" in process.stdout


def test_launcher_exits_as_the_script_does(tmp_path):
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(3)\n")
    assert launch("--conf", "backend:sim", str(exits)).returncode == 3
    raises = tmp_path / "raises.py"
    raises.write_text("raise ValueError('from the script')\n")
    process = launch("--conf", "backend:sim", str(raises))
    assert process.returncode == 1
    assert "ValueError: from the script" in process.stderr


def test_launcher_reports_a_swap_that_is_too_late(program):
    process = launch("--conf", "backend:sim", str(program), FAKE_TORCH_CUDA_INITIALIZED="1")
    assert process.returncode == 1
    assert process.stdout == ""  # the program did not run
    assert "PyTorch says: Can't swap an already initialized allocator" in process.stderr
    assert "PyTorch can swap its allocator only before the first CUDA allocation" in process.stderr
    assert "python -m bucketalloc_torch [--conf CONF] script.py" in process.stderr


def test_launcher_reports_a_bad_conf(program):
    process = launch("--conf", "backend:sim,no_such_key:1", str(program))
    assert process.returncode == 1
    assert "bucketalloc option 'no_such_key' (value '1') is unknown" in process.stderr
    assert process.stdout == ""


# ---- enable() -----------------------------------------------------------------------------------


def test_enable_refuses_when_the_native_allocator_holds_memory():
    run_with_fake_torch(
        """
        import torch, bucketalloc_torch as ba
        try:
            ba.enable()
        except ba.BucketallocError as e:
            assert "PyTorch's native allocator already holds 2097152 bytes" in str(e), e
            assert "python -m bucketalloc_torch" in str(e), e
        else:
            raise AssertionError("enable() succeeded")
        assert torch._fake.log == [], torch._fake.log
        """,
        FAKE_TORCH_CUDA_INITIALIZED="1",
        FAKE_TORCH_NATIVE_RESERVED="2097152",
    )


def test_enable_twice():
    run_with_fake_torch(
        """
        import torch, bucketalloc_torch as ba
        first = ba.enable("backend:sim,capacity:64MiB")
        assert ba.enable("capacity:64MiB,backend:sim") is first  # the same configuration
        assert ba.enable() is first  # no configuration asked for
        calls = [entry[0] for entry in torch._fake.log]
        assert calls.count("CUDAPluggableAllocator") == 1 and calls.count("change_current_allocator") == 1
        ba.memory_stats()  # creates the allocator, as PyTorch's first CUDA allocation would
        for conf, options, expected in [
            ("backend:sim,capacity:128MiB", {}, "the allocator already exists"),
            ("backend:sim,capacity:64MiB", {"raise_on_oom": False}, "already PyTorch's allocator with raise_on_oom=True"),
        ]:
            try:
                ba.enable(conf, **options)
            except ba.BucketallocError as e:
                assert expected in str(e), e
            else:
                raise AssertionError(f"enable({conf!r}, {options}) succeeded")
        """
    )


def test_enable_without_raise_on_oom_uses_the_null_returning_malloc():
    run_with_fake_torch(
        """
        import torch, bucketalloc_torch as ba
        ba.enable(raise_on_oom=False)
        assert torch._fake.log[0][2] == "bucketalloc_malloc", torch._fake.log
        """
    )


def test_enable_skips_setters_this_torch_lacks():
    run_with_fake_torch(
        """
        import torch, bucketalloc_torch as ba
        ba.enable()
        calls = [entry[0] for entry in torch._fake.log]
        assert calls == ["CUDAPluggableAllocator", "set_init_fn", "set_reset_fn", "set_memory_fraction_fn",
                         "change_current_allocator"], calls
        """,
        FAKE_TORCH_MISSING_SETTERS="set_record_stream_fn,set_base_alloc_fn,set_begin_allocate_to_pool,"
        "set_end_allocate_to_pool_fn,set_release_pool",
    )


def test_enable_with_options_and_patch_later():
    run_with_fake_torch(
        """
        import torch, bucketalloc_torch as ba
        ba.enable(capacity="96MiB", debug_check_invariants=True)  # extends BUCKETALLOC_CONF
        assert {"backend:sim", "capacity:96MiB", "debug_check_invariants:true"} <= set(ba.config().split(","))
        assert torch.cuda.memory_stats is not ba.memory_stats
        ba.enable(patch_torch=True)
        assert torch.cuda.memory_stats is ba.memory_stats
        ba.enable(patch_torch=True)  # patching twice keeps the torch originals
        ba.unpatch_torch()
        assert torch.cuda.memory_stats is torch.cuda.memory.memory_stats is not ba.memory_stats
        """
    )


def test_enable_without_torch_says_it_needs_it():
    run_python(
        """
        import importlib.abc, sys

        class NoTorch(importlib.abc.MetaPathFinder):  # torch is installed here: hide it
            def find_spec(self, name, path, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, NoTorch())
        import bucketalloc_torch as ba
        try:
            ba.enable()
        except ImportError as e:
            assert "bucketalloc_torch.enable() needs PyTorch" in str(e), e
        else:
            raise AssertionError("enable() succeeded without torch")
        """,
        conf="backend:sim",
    )


def test_inspection_functions_do_not_import_torch():
    run_with_fake_torch(
        """
        import sys
        import bucketalloc_torch as ba
        ba.memory_stats(); ba.memory_summary(); ba.snapshot(); ba.fragmentation_histogram()
        ba.last_oom_report(); ba.config(); ba.check_invariants(); ba.empty_cache()
        ba.reset_peak_memory_stats(); ba.record_memory_history(None); ba.configure("backend:sim")
        assert "torch" not in sys.modules, "an inspection function imported torch"
        """
    )
