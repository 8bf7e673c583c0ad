"""Tuned kernel choices per target: written by ``tilegen tune --write``, read by ``default_specs``.

One JSON file per target, ``<dir>/<target>.json``; ``<dir>`` is ``$TILEGEN_TUNED_DIR`` if set,
else ``tilegen/build/tuned/`` in the package.  Format (version 1)::

    {
      "tilegen_tuned": 1,
      "target": "neoverse-v2",            # the preset's own name (not an alias) = the file stem
      "model": "neoverse-v2",             # llvm-mca -mcpu the scores were computed with
      "families": {
        "q4_0": {
          "gemm": "q4_0:i8mm:16x4",       # spec string, a gemm tile (not spec.is_gemv)
          "gemv": "q4_0:dotprod:1x4:k16:s2",   # spec string, spec.is_gemv (or null)
          "shared_rhs": true,             # gemv reads the gemm's packed RHS (layout.same_rhs)
          "best_gemm": "q4_0:i8mm:12x4",  # optional: the best gemm and gemv of any layout
          "best_gemv": "q4_0:i8mm:1x12:k8:s2",   #   (pack_weights(..., for_ops=("gemm", "gemv")))
          "scores": {"gemm": 42.1, "gemv": 9.8,   # MACs/cycle over a 32-k block (information)
                     "best_gemm": 63.1, "best_gemv": 26.8},
          "measured": {"method": {...}, "ranking": {"gemm": [...], "gemv": [...]}}
                                          # optional (tune --measure): how the pair was timed
        }
      }
    }

``gemm``/``gemv`` are the default pair (one packed layout); ``best_gemm``/``best_gemv`` (absent
or null: the same as the pair's) are the best kernels regardless of layout, which the runtime
uses only for weights packed with ``for_ops=("gemm", "gemv")`` (one packing per layout).
``default_specs(target)`` puts the tuned specs of every family first (pair, then best),
ahead of the built-in defaults.  Reset with ``tilegen tune --target T --reset [--family F]`` or by deleting the file.
Reading validates everything and raises :class:`TunedError` naming the file and the problem.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..generator.spec import KernelSpec
from ..generator.validate import parse_spec
from ..families import FAMILIES
from ..records import SpecError
from .targets import TARGETS, Target, TargetError

__all__ = ["TunedError", "TunedFamily", "TunedFile", "FORMAT_VERSION", "tuned_dir", "tuned_path",
           "read_tuned", "write_tuned", "reset_tuned", "tuned_specs", "tuned_roles"]

FORMAT_VERSION = 1
_ENTRY_KEYS = {"gemm", "gemv", "shared_rhs", "scores", "best_gemm", "best_gemv", "measured"}
_MEASURED_KEYS = {"method", "ranking"}


class TunedError(TargetError):
    """A tuned-kernel file that cannot be used; the message names the file and the rule."""


@dataclass(frozen=True)
class TunedFamily:
    family: str
    gemm: KernelSpec | None
    gemv: KernelSpec | None
    shared_rhs: bool
    scores: dict[str, float] = field(default_factory=dict, compare=False)
    best_gemm: KernelSpec | None = None     # best of any layout (None: the pair's gemm)
    best_gemv: KernelSpec | None = None
    # `tune --measure`: {"method": {...}, "ranking": {"gemm": [...], "gemv": [...]}} (the
    # timings the pair was chosen by; information, like the scores)
    measured: dict | None = field(default=None, compare=False)

    @property
    def top_gemm(self) -> KernelSpec | None:
        """The best gemm regardless of layout (the pair's when none is recorded)."""
        return self.best_gemm or self.gemm

    @property
    def top_gemv(self) -> KernelSpec | None:
        return self.best_gemv or self.gemv

    def specs(self) -> list[KernelSpec]:
        """The pair, then the best gemm and gemv (each once)."""
        out: list[KernelSpec] = []
        for s in (self.gemm, self.gemv, self.best_gemm, self.best_gemv):
            if s is not None and s not in out:
                out.append(s)
        return out

    def as_dict(self) -> dict:
        d = {"gemm": self.gemm.spec_string if self.gemm else None,
             "gemv": self.gemv.spec_string if self.gemv else None,
             "shared_rhs": self.shared_rhs}
        for role in ("best_gemm", "best_gemv"):
            s = getattr(self, role)
            if s is not None:
                d[role] = s.spec_string
        d["scores"] = dict(self.scores)
        if self.measured is not None:
            d["measured"] = self.measured
        return d


@dataclass(frozen=True)
class TunedFile:
    target: str
    model: str
    families: dict[str, TunedFamily]

    def as_dict(self) -> dict:
        return {"tilegen_tuned": FORMAT_VERSION, "target": self.target, "model": self.model,
                "families": {f: e.as_dict() for f, e in sorted(self.families.items())}}


def tuned_dir(directory: str | os.PathLike | None = None) -> Path:
    """``directory``, else ``$TILEGEN_TUNED_DIR``, else the package's ``build/tuned``."""
    if directory is not None:
        return Path(directory)
    env = os.environ.get("TILEGEN_TUNED_DIR")
    return Path(env) if env else Path(__file__).resolve().parent / "tuned"


def tuned_path(target: Target, directory: str | os.PathLike | None = None) -> Path:
    return tuned_dir(directory) / f"{target.name}.json"


def tuned_targets(directory: str | os.PathLike | None = None) -> list[str]:
    """The targets that have a tuned file (in ``directory``, else as :func:`tuned_dir`)."""
    d = tuned_dir(directory)
    return sorted({t.name for t in TARGETS.values() if (d / f"{t.name}.json").is_file()})


def _spec(path: Path, target: Target, family: str, role: str, text,
          key: str | None = None) -> KernelSpec | None:
    where = f"{path}: families.{family}.{key or role}"
    if text is None:
        return None
    if not isinstance(text, str):
        raise TunedError(f"{where} must be a spec string or null, got {text!r}")
    try:
        spec = parse_spec(text)
    except SpecError as e:
        raise TunedError(f"{where}: {e}") from None
    if spec.family != family:
        raise TunedError(f"{where}: {text!r} is a {spec.family} kernel, not {family}")
    if (role == "gemv") != spec.is_gemv:
        raise TunedError(f"{where}: {text!r} has mr={spec.mr_str}; a {role} kernel needs "
                         f"{'mr == 1' if role == 'gemv' else 'mr > 1 or mr in VL units'}")
    if not target.supports(spec):
        missing = ", ".join(sorted(set(spec.features) - target.features))
        raise TunedError(f"{where}: {text!r} needs {missing}, which target {target.name} lacks")
    return spec


def _parse(path: Path, target: Target, data) -> TunedFile:
    if not isinstance(data, dict):
        raise TunedError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if data.get("tilegen_tuned") != FORMAT_VERSION:
        raise TunedError(f"{path}: \"tilegen_tuned\" must be {FORMAT_VERSION}, got "
                         f"{data.get('tilegen_tuned')!r}")
    if data.get("target") != target.name:
        raise TunedError(f"{path}: written for target {data.get('target')!r}, read for "
                         f"{target.name!r}")
    model = data.get("model")
    if not isinstance(model, str):
        raise TunedError(f"{path}: \"model\" must be a string, got {model!r}")
    fams = data.get("families")
    if not isinstance(fams, dict):
        raise TunedError(f"{path}: \"families\" must be an object, got {fams!r}")
    out: dict[str, TunedFamily] = {}
    for fam, e in fams.items():
        if fam not in FAMILIES:
            raise TunedError(f"{path}: unknown family {fam!r}; known: {', '.join(sorted(FAMILIES))}")
        if not isinstance(e, dict):
            raise TunedError(f"{path}: families.{fam} must be an object, got {e!r}")
        extra = set(e) - _ENTRY_KEYS
        if extra:
            raise TunedError(f"{path}: families.{fam} has unknown keys {', '.join(sorted(extra))}; "
                             f"allowed: {', '.join(sorted(_ENTRY_KEYS))}")
        gemm = _spec(path, target, fam, "gemm", e.get("gemm"))
        gemv = _spec(path, target, fam, "gemv", e.get("gemv"))
        if gemm is None and gemv is None:
            raise TunedError(f"{path}: families.{fam} names neither a gemm nor a gemv kernel")
        best_gemm = _spec(path, target, fam, "gemm", e.get("best_gemm"), "best_gemm")
        best_gemv = _spec(path, target, fam, "gemv", e.get("best_gemv"), "best_gemv")
        shared = e.get("shared_rhs", False)
        if not isinstance(shared, bool):
            raise TunedError(f"{path}: families.{fam}.shared_rhs must be true or false")
        scores = e.get("scores", {})
        if not (isinstance(scores, dict) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in scores.values())):
            raise TunedError(f"{path}: families.{fam}.scores must map names to numbers")
        measured = e.get("measured")
        if measured is not None and not (
                isinstance(measured, dict) and set(measured) == _MEASURED_KEYS
                and isinstance(measured["method"], dict) and isinstance(measured["ranking"], dict)
                and all(isinstance(v, list) for v in measured["ranking"].values())):
            raise TunedError(f"{path}: families.{fam}.measured must be an object with "
                             f"\"method\" (an object) and \"ranking\" (op -> list)")
        out[fam] = TunedFamily(fam, gemm, gemv, shared, {k: float(v) for k, v in scores.items()},
                               best_gemm, best_gemv, measured)
    return TunedFile(target.name, model, out)


def read_tuned(target: Target, directory: str | os.PathLike | None = None) -> TunedFile | None:
    """The target's tuned file, validated; None when there is none."""
    path = tuned_path(target, directory)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TunedError(f"{path}: cannot read: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TunedError(f"{path} is not valid JSON ({e}); fix it or reset it with "
                         f"`tilegen tune --target {target.name} --reset`") from None
    try:
        return _parse(path, target, data)
    except TunedError as e:
        raise TunedError(f"{e} (reset with `tilegen tune --target {target.name} --reset`)") from None


def tuned_roles(target: Target, directory: str | os.PathLike | None = None) -> dict[str, set[str]]:
    """Kernel name -> its tuned roles: "pair" (the default gemm/gemv sharing one layout),
    "best_gemm", "best_gemv" (the best of any layout; the pair's kernels when none recorded)."""
    tf = read_tuned(target, directory)
    out: dict[str, set[str]] = {}
    for e in (tf.families.values() if tf is not None else ()):
        for role, s in (("pair", e.gemm), ("pair", e.gemv), ("best_gemm", e.top_gemm),
                        ("best_gemv", e.top_gemv)):
            if s is not None:
                out.setdefault(s.name, set()).add(role)
    return out


def tuned_specs(target: Target, directory: str | os.PathLike | None = None) -> list[KernelSpec]:
    """The tuned kernels of every family of ``target`` (gemm, gemv, best gemm, best gemv;
    each once), or []."""
    tf = read_tuned(target, directory)
    if tf is None:
        return []
    return [s for _, e in sorted(tf.families.items()) for s in e.specs()]


def write_tuned(target: Target, model: str, entry: TunedFamily,
                directory: str | os.PathLike | None = None) -> Path:
    """Set ``entry`` for its family in the target's tuned file (other families are kept)."""
    path = tuned_path(target, directory)
    old = read_tuned(target, directory)
    fams = dict(old.families) if old is not None else {}
    fams[entry.family] = entry
    tf = TunedFile(target.name, model, fams)
    _parse(path, target, json.loads(json.dumps(tf.as_dict())))   # never write what we cannot read
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(tf.as_dict(), indent=2) + "\n")
    tmp.replace(path)
    return path


def reset_tuned(target: Target, family: str | None = None,
                directory: str | os.PathLike | None = None) -> Path | None:
    """Drop ``family`` from the target's tuned file (every family: delete the file).

    Returns the path changed or removed, None when there was nothing to reset.  A file that
    does not parse is removed only by a whole reset (``family=None``)."""
    path = tuned_path(target, directory)
    if not path.exists():
        return None
    if family is None:
        path.unlink()
        return path
    old = read_tuned(target, directory)
    assert old is not None
    if family not in old.families:
        return None
    fams = {f: e for f, e in old.families.items() if f != family}
    if not fams:
        path.unlink()
        return path
    path.write_text(json.dumps(TunedFile(old.target, old.model, fams).as_dict(), indent=2) + "\n")
    return path
