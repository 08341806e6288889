"""Devices and configuration: device arguments as indexes, and the allocator's configuration
(configure(), config(), and the composition of a BUCKETALLOC_CONF string from ``conf`` and options
that enable() shares)."""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional

from . import _lib

CONF_ENV = "BUCKETALLOC_CONF"

Device = Any  # None, an int, "cuda", "cuda:N" or a torch.device


def _current_device() -> int:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return 0


_DEVICE_ACCEPTED = f"None, an int from 0 to {_lib.C_INT_MAX}, 'cuda', 'cuda:N' or a torch.device of type cuda"


def _device_index(device: Device) -> int:
    """Turns a device argument into an index (see the package docstring for what is accepted); an
    index beyond a C int (which ctypes would wrap to another device: 2**32 to 0) is refused. Callers
    take the index before _lib.lib(), so that a refused device never loads the library."""
    if device is None:
        return _current_device()
    index: Any = device  # an int, else what checked_int refuses by its type
    if isinstance(device, str):
        kind, _, number = device.partition(":")
        if kind != "cuda" or (number and not number.isdigit()):
            raise ValueError(f"device={device!r} is not a CUDA device; accepted: {_DEVICE_ACCEPTED}")
        index = int(number) if number else None
    elif not isinstance(device, int) and hasattr(device, "type") and hasattr(device, "index"):  # a torch.device
        if device.type != "cuda":
            raise ValueError(f"device={device!r} is not a CUDA device; accepted: {_DEVICE_ACCEPTED}")
        index = device.index
    if index is None:
        return _current_device()
    return _lib.checked_int("device", index, 0, _lib.C_INT_MAX, _DEVICE_ACCEPTED, shown=device)


def _format_option(key: str, value: Any, in_list: bool = False) -> str:
    """Formats one option value in BUCKETALLOC_CONF syntax (bools True/False, lists [a,b]).

    A value is one value: text with a ',' outside one bracketed list would set other keys
    (capacity="1GiB,sim_devices:2"), so it is refused; "[256:1,>:8]" is one list value.
    """
    _lib.checked_text("option name", key, "a keyword naming an option")
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)) and not in_list:
        return "[" + ",".join(_format_option(key, v, True) for v in value) + "]"
    if not isinstance(value, (str, int, float)):
        raise TypeError(f"option {key}={value!r} has type {type(value).__name__}; accepted: a str, int, float, "
                        "bool, or a list of str, int or float")
    text = str(value)
    _lib.checked_text(f"option {key}", text, "a str, int, float, bool, or a list of str, int or float")
    whole_list = not in_list and text.startswith("[") and text.endswith("]") and not any(c in text[1:-1] for c in "[]")
    if not whole_list and any(c in text for c in ",[]"):
        raise ValueError(f"option {key}={value!r} is not one value; accepted: a value without ',', '[' or ']', "
                         "or one bracketed list (each key is its own keyword)")
    return text


def _compose_conf(conf: Optional[str], options: Dict[str, Any]) -> Optional[str]:
    """Returns `conf` (BUCKETALLOC_CONF when None) extended by `options`, or None for neither."""
    if conf is not None and not isinstance(conf, str):
        raise TypeError(f"conf must be a string like 'backend:sim,capacity:4GiB' or None, not {type(conf).__name__}")
    if conf is not None:
        _lib.checked_text("conf", conf, "a string like 'backend:sim,capacity:4GiB' or None")
    if conf is None and not options:
        return None
    extra = [f"{key}:{_format_option(key, value)}" for key, value in options.items()]  # checked before ctypes
    # Without `conf`, the options extend what the environment gives, as the library reads it
    # (BUCKETALLOC_CONF, else PyTorch's variables).
    base = conf if conf is not None else _lib.read_text(_lib.lib().bucketalloc_env_config_string)
    return ",".join(([base] if base else []) + extra)


def _apply_conf(conf: Optional[str]) -> None:
    if conf is not None:
        encoded = _lib.checked_text("conf", conf)
        _lib.check(_lib.lib().bucketalloc_configure(encoded), "bucketalloc_configure")


def configure(conf: Optional[str] = None, **options: Any) -> None:
    """Sets the configuration of the process-wide allocator, without importing torch.

    Args:
        conf: options in BUCKETALLOC_CONF syntax, e.g. ``"backend:sim,capacity:4GiB"``
            (docs/configuration.md lists them); None: the environment (BUCKETALLOC_CONF, else PyTorch's
            PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF, as the library reads them).
        **options: more options, appended to `conf` and winning over it: ``capacity="4GiB"``,
            ``debug_check_invariants=True``, ``tiers=["64MiB", "128MiB"]``.
        With neither, nothing is set: the allocator is created from BUCKETALLOC_CONF, else defaults.

    Raises:
        BucketallocError: a bad key or value (the message names it and what is accepted), or the
            allocator already exists with a different configuration (it is created on first use
            and its configuration cannot change afterwards). Setting the configuration it already
            has is accepted.
        TypeError, ValueError: `conf`, an option's name or value holds a NUL (checked before
            ctypes, which would end the text there), or an option is not one value.
    """
    _apply_conf(_compose_conf(conf, options))


def config() -> str:
    """Returns the allocator's effective configuration in BUCKETALLOC_CONF syntax (every key)."""
    return _lib.read_text(_lib.lib().bucketalloc_config_string)
