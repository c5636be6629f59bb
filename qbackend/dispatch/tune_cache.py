"""The on-disk cache of tuned provider choices: which provider was fastest for one layer's shapes
on this machine, so a second convert of the same model does no timing.

Where: `default_cache_path()`, i.e. `$QBACKEND_CACHE_DIR/tune-v1.json` if QBACKEND_CACHE_DIR is
set, else `$XDG_CACHE_HOME/qbackend/tune-v1.json`, else `~/.cache/qbackend/tune-v1.json`.

File format (JSON, UTF-8)::

    {"format": "qbackend-tune",
     "version": 1,
     "machines": {
       "<fingerprint key>": {                      # canonical JSON of "fingerprint" (sorted keys)
         "fingerprint": {"cpu_vendor": ..., "cpu_model": ..., "isa_class": ..., "isa_override": ...,
                         "torch": ..., "qbackend": ..., "threads": ...},
         "entries": {
           "<key json>": {"provider": "onednn", "times_us": {"onednn": 412.0, "fbgemm": 530.0}},
           ...}},
       ...}}

`<key json>` is `TuneKey.to_json()`: `{"op": ..., "shape": [[name, value], ...], "variant": [[name,
value], ...]}` with sorted names, compact separators (tuples become lists). A machine's section is
found by comparing its "fingerprint" object with `machine_fingerprint()` (the outer key is only an
index, recomputed on load), so a file copied from another machine, or written under another
QBACKEND_ISA, torch or qbackend version or torch thread count, is not used here; its sections are
kept in the file.

Trust: the file is validated on every load. A file that cannot be read or parsed, or whose
structure is wrong (format, version, machines, a section without fingerprint/entries objects),
is ignored as a whole with one `TuneCacheWarning` naming the file and the problem, and replaced
by the next `put`. Single entries that are malformed (key not a TuneKey, provider unknown to
qbackend, times not finite positive numbers, provider not among its own times) are dropped,
with one warning per load naming the file and the entries' keys (tuning measures them again). A missing file is an empty cache (no warning).

Writing: every `put` re-reads the file, merges its current entries (read-modify-write, under an
advisory lock file `<name>.lock` where the OS has fcntl), sets the new entry and replaces the file
atomically (temporary file in the same directory + os.replace). Two processes tuning different
layers keep each other's results; on the same key the last writer wins. If the directory cannot
be created or written, one warning is issued and the cache keeps working in memory.
"""
from __future__ import annotations

import contextlib
import json
import math
import operator
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import torch

from ..core import isa
from ..core.version import VERSION as QBACKEND_VERSION
from ..ops import registry
from .cpu import cpu_features

try:
    import fcntl
except ImportError:  # pragma: no cover  (not POSIX)
    fcntl = None

FORMAT = "qbackend-tune"
VERSION = 1
FILE_NAME = f"tune-v{VERSION}.json"
ENV_CACHE_DIR = "QBACKEND_CACHE_DIR"


class TuneCacheWarning(UserWarning):
    """The tune cache file was ignored (in whole or in part), or cannot be written."""


# ---- keys and results -----------------------------------------------------------------------

def _shape_value(name: str, value) -> int | tuple:
    if isinstance(value, (list, tuple)):
        return tuple(_shape_value(name, v) for v in value)
    if isinstance(value, bool):
        raise TypeError(f"TuneKey shape {name!r}: expected an int or a tuple of ints, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"TuneKey shape {name!r}: expected an int or a tuple of ints, got {value!r}") from None


def _variant_value(name: str, value):
    if isinstance(value, (list, tuple)):
        return tuple(_variant_value(name, v) for v in value)
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    try:
        return operator.index(value)  # numpy / torch integers
    except TypeError:
        raise TypeError(f"TuneKey variant {name!r}: expected str, int, bool, finite float, None or a tuple "
                        f"of them, got {value!r}") from None


def _pairs(mapping: Mapping, convert, what: str) -> tuple:
    out = []
    for name, value in mapping.items():
        if not isinstance(name, str):
            raise TypeError(f"TuneKey {what} names must be strings, got {name!r}")
        out.append((name, convert(name, value)))
    return tuple(sorted(out))


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


@dataclass(frozen=True)
class TuneKey:
    """What a tuning result is for: the op kind, the shapes the dispatcher sees, and the variant
    (output dtype, fused post-op, residual, activation bits...) that changes the kernel run.

    Build it with `TuneKey.make("linear", {"m": 64, "k": 768, "n": 768}, post_op="relu")`:
    the order of names does not matter, values are normalised (lists -> tuples, integer-likes ->
    int) and the key is JSON-serialisable (`to_json` / `from_json`)."""

    op: str        # "linear" | "conv2d" | "linear_dynamic"
    shape: tuple   # sorted ((name, int | tuple of ints), ...)
    variant: tuple  # sorted ((name, str | int | bool | float | None | tuple), ...)

    @classmethod
    def make(cls, op: str, shape: Mapping, **variant) -> "TuneKey":
        if not isinstance(op, str) or not op:
            raise TypeError(f"TuneKey op must be a non-empty string, got {op!r}")
        return cls(op, _pairs(shape, _shape_value, "shape"), _pairs(variant, _variant_value, "variant"))

    def to_json(self) -> str:
        """The canonical JSON form (the key of its entry in the cache file)."""
        return json.dumps({"op": self.op, "shape": self.shape, "variant": self.variant},
                          sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "TuneKey":
        """Parse `to_json`'s form; raises ValueError or TypeError on anything else."""
        obj = json.loads(text)
        if not isinstance(obj, dict) or set(obj) != {"op", "shape", "variant"}:
            raise ValueError("expected an object with op, shape and variant")
        for part in ("shape", "variant"):
            if not isinstance(obj[part], list) or not all(
                    isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in obj[part]):
                raise ValueError(f"{part} must be a list of [name, value] pairs")
        shape = {name: _tuples(v) for name, v in obj["shape"]}
        variant = {name: _tuples(v) for name, v in obj["variant"]}
        if len(shape) != len(obj["shape"]) or len(variant) != len(obj["variant"]):
            raise ValueError("repeated name")
        return cls.make(obj["op"], shape, **variant)

    def __str__(self) -> str:
        return self.to_json()


def _fmt_us(t: float) -> str:
    return f"{t:.0f}" if t >= 100 else f"{t:.1f}" if t >= 10 else f"{t:.2f}"


@dataclass(frozen=True)
class TuneResult:
    """The provider that was fastest, and the time per call (microseconds, as tune measured it) of each
    candidate that ran. `times_us` is stored read-only."""

    provider: str
    times_us: Mapping[str, float]

    def __post_init__(self):
        object.__setattr__(self, "times_us", MappingProxyType({str(p): float(t) for p, t in self.times_us.items()}))

    def why(self) -> str:
        """E.g. "tuned: onednn 412 us, fbgemm 530 us (1.29x)": the candidates fastest first, and
        how much slower the runner-up is than the chosen provider."""
        ranked = sorted(self.times_us.items(), key=lambda pt: (pt[0] != self.provider, pt[1]))
        text = "tuned: " + ", ".join(f"{p} {_fmt_us(t)} us" for p, t in ranked)
        if len(ranked) == 1:
            return text + " (only candidate)"
        best, second = ranked[0][1], ranked[1][1]
        return text + (f" ({second / best:.2f}x)" if best > 0 else "")


def _result_problem(result: Any, known: frozenset[str]) -> str | None:
    """Why `result` (a TuneResult or the file's {"provider", "times_us"} object) is not a valid
    entry, or None."""
    if isinstance(result, TuneResult):
        provider, times = result.provider, result.times_us
    elif isinstance(result, dict) and set(result) == {"provider", "times_us"}:
        provider, times = result["provider"], result["times_us"]
    else:
        return "an entry must be an object with exactly provider and times_us"
    if not isinstance(provider, str) or provider not in known:
        return f"unknown provider {provider!r}"
    if not isinstance(times, Mapping) or not times:
        return "times_us must be a non-empty object"
    for p, t in times.items():
        if not isinstance(p, str) or p not in known:
            return f"times_us names unknown provider {p!r}"
        # positive: tune_route divides by the fastest time, and no kernel call takes no time
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            return f"times_us[{p!r}] = {t!r} is not a finite positive number"
    if provider not in times:
        return f"provider {provider!r} has no time in times_us"
    return None


# ---- the machine ----------------------------------------------------------------------------

def default_cache_path() -> Path:
    """$QBACKEND_CACHE_DIR/tune-v1.json, else $XDG_CACHE_HOME/qbackend/tune-v1.json, else
    ~/.cache/qbackend/tune-v1.json (read from the environment at each call)."""
    explicit = os.environ.get(ENV_CACHE_DIR, "").strip()
    if explicit:
        return Path(explicit).expanduser() / FILE_NAME
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "qbackend" / FILE_NAME


def machine_fingerprint() -> dict:
    """What a tuning result depends on besides the layer: the CPU (vendor and model string), the
    ISA class in use (after QBACKEND_ISA) and the override itself, the torch and qbackend
    versions, and torch's intra-op thread count (read now: set_num_threads changes it)."""
    f = cpu_features()
    return {
        "cpu_vendor": f.vendor,
        "cpu_model": f.model_name,
        "isa_class": f.isa_class,
        "isa_override": isa.requested(),
        "torch": torch.__version__,
        "qbackend": QBACKEND_VERSION,
        "threads": torch.get_num_threads(),
    }


def _fingerprint_key(fp: Mapping) -> str:
    return json.dumps(fp, sort_keys=True, separators=(",", ":"), allow_nan=False)


# ---- the cache ------------------------------------------------------------------------------

class _FileProblem(Exception):
    pass


def _parse(text: str, known: frozenset[str]) -> tuple[dict, list[str]]:
    """The file's sections {fingerprint key: (fingerprint, {key json: TuneResult})} and the
    problems of the entries dropped. Raises _FileProblem when the file as a whole is invalid."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise _FileProblem(f"not valid JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(doc, dict):
        raise _FileProblem("not a JSON object")
    if doc.get("format") != FORMAT:
        raise _FileProblem(f"format is {doc.get('format')!r}, expected {FORMAT!r}")
    if doc.get("version") != VERSION or isinstance(doc.get("version"), bool):
        raise _FileProblem(f"version is {doc.get('version')!r}, expected {VERSION}")
    machines = doc.get("machines")
    if not isinstance(machines, dict):
        raise _FileProblem("'machines' is not an object")
    sections: dict[str, tuple[dict, dict[str, TuneResult]]] = {}
    dropped: list[str] = []
    for name, section in machines.items():
        if not (isinstance(section, dict) and isinstance(section.get("fingerprint"), dict)
                and isinstance(section.get("entries"), dict)):
            raise _FileProblem(f"machine section {name!r} lacks a fingerprint or entries object")
        fp = section["fingerprint"]
        try:
            fkey = _fingerprint_key(fp)
        except ValueError:  # NaN / Infinity: could not be written back
            raise _FileProblem(f"machine section {name!r} has a non-finite number in its fingerprint") from None
        entries = sections.setdefault(fkey, (fp, {}))[1]
        for key_text, value in section["entries"].items():
            try:
                key = TuneKey.from_json(key_text).to_json()
            except (ValueError, TypeError) as exc:
                dropped.append(f"key {key_text[:80]!r} is not a tune key ({exc})")
                continue
            problem = _result_problem(value, known)
            if problem is not None:
                dropped.append(f"{key}: {problem}")
                continue
            entries[key] = TuneResult(value["provider"], value["times_us"])
    return sections, dropped


def _serialise(sections: Mapping) -> str:
    machines = {
        fkey: {"fingerprint": fp,
               "entries": {k: {"provider": r.provider, "times_us": dict(r.times_us)}
                           for k, r in sorted(entries.items())}}
        for fkey, (fp, entries) in sorted(sections.items())
    }
    return json.dumps({"format": FORMAT, "version": VERSION, "machines": machines}, indent=1,
                      allow_nan=False) + "\n"


class TuneCache:
    """Tuned provider choices for this machine, backed by one JSON file (see the module
    docstring for the format and the trust and concurrency rules).

    `get` reads the file when it changed since the last read (a stat per call); `put` merges
    the file's current contents and replaces it atomically. Each distinct problem with the file
    is warned about once per TuneCache object."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_cache_path()
        self._sections: dict[str, tuple[dict, dict[str, TuneResult]]] = {}
        self._unsaved: dict[str, tuple[dict, dict[str, TuneResult]]] = {}  # puts not yet on disk
        self._stamp: object = None   # the file's (mtime, size, inode) when last read
        self._warned: set[str] = set()

    # -- public --

    def get(self, key: TuneKey) -> TuneResult | None:
        """The stored result for `key` on this machine (fingerprint), or None."""
        self._refresh()
        fkey = _fingerprint_key(machine_fingerprint())
        for store in (self._unsaved, self._sections):
            hit = store.get(fkey, (None, {}))[1].get(key.to_json())
            if hit is not None:
                return hit
        return None

    def put(self, key: TuneKey, result: TuneResult) -> None:
        """Store `result` for `key` on this machine and write the file now (merged with its
        current contents, atomically). Raises ValueError for a result the file could not hold
        (unknown provider, non-finite times)."""
        problem = _result_problem(result, registry.all_names())
        if problem is not None:
            raise ValueError(f"cannot cache {key}: {problem}")
        fp = machine_fingerprint()
        fkey = _fingerprint_key(fp)
        self._unsaved.setdefault(fkey, (fp, {}))[1][key.to_json()] = result
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock():
                self._refresh(force=True)
                merged = {f: (fp_, dict(entries)) for f, (fp_, entries) in self._sections.items()}
                for f, (fp_, entries) in self._unsaved.items():
                    merged.setdefault(f, (fp_, {}))[1].update(entries)
                self._write(_serialise(merged))
                self._sections, self._unsaved = merged, {}
                self._stamp = self._file_stamp()
        except OSError as exc:
            self._warn(f"cannot write the tune cache {self.path} ({exc}); tuning results are kept in memory only",
                       once_as="write")

    def __repr__(self) -> str:
        return f"TuneCache({str(self.path)!r})"

    # -- internals --

    def _warn(self, message: str, once_as: str | None = None) -> None:
        """Warn once per TuneCache for each distinct message (or each `once_as` tag)."""
        tag = once_as or message
        if tag not in self._warned:
            self._warned.add(tag)
            warnings.warn(message, TuneCacheWarning, stacklevel=4)

    def _file_stamp(self):
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):  # no file (or no directory) yet
            return None
        except OSError as exc:
            return ("error", str(exc))
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _refresh(self, force: bool = False) -> None:
        stamp = self._file_stamp()
        if not force and stamp == self._stamp:
            return
        self._stamp = stamp
        self._sections = {}
        if stamp is None:
            return
        try:
            text = self.path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return
        except (OSError, UnicodeDecodeError) as exc:
            self._warn(f"ignoring tune cache {self.path}: cannot read it ({exc}); it will be replaced")
            return
        try:
            self._sections, dropped = _parse(text, registry.all_names())
        except _FileProblem as exc:
            self._warn(f"ignoring tune cache {self.path}: {exc}; it will be replaced")
            return
        if dropped:
            shown = "; ".join(dropped[:3]) + ("; ..." if len(dropped) > 3 else "")
            self._warn(f"tune cache {self.path}: dropped {len(dropped)} invalid entr"
                       f"{'y' if len(dropped) == 1 else 'ies'} ({shown}); tuning measures them again")

    def _write(self, text: str) -> None:
        try:
            mode = os.stat(self.path).st_mode & 0o777
        except OSError:
            mode = 0o644  # mkstemp's 0600 would hide a shared cache directory's file from others
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def _lock(self):
        """An advisory exclusive lock on `<file>.lock` for the read-modify-write (best effort:
        without fcntl, or if the lock file cannot be opened, writers are not serialised and the
        last one wins)."""
        if fcntl is None:
            yield
            return
        try:
            fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock
