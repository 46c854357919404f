"""Fuzzing the model importer (issue 33, item 4): random mutations of a valid small mpc3
safetensors file, a valid mpc3 .npz and valid tiny Hugging Face BERT (single file and
sharded) and GPT-2 directories - byte flips, truncations, and mutations of the header's
JSON fields (huge, negative, overlapping offsets; wrong dtypes; huge shapes; deep nesting;
wrong types), of the .npy headers and members of the archive, and of config.json and
index.json - each either imports or is refused with one ValueError of one line, through
``load_model_source`` and through ``mpc3 import`` (exit code 0 or 2, one stderr line).

The cases run in one child process limited to 2 GiB of address space; its peak RSS (VmHWM)
must stay under PEAK_MB and the whole run under a minute on a loaded 2-core box. Fixed seed,
CASES cases; everything lives in the test's temporary directory."""
import contextlib
import io
import json
import shutil
import struct
import sys
import time
import traceback
import zipfile
from pathlib import Path

import numpy as np

from helpers import model_files as MF
SEED, CASES = 20261128, 300
PEAK_MB = 300
HUGE = [2 ** 63, 2 ** 64 + 5, 10 ** 30, -1, -(2 ** 63), 2 ** 31, 10 ** 12]
ODD = [None, True, "x", 1.5, [], {}, [1, 2], {"a": 1}, "1" * 300, float("1e308")]


def deep(rng, kind="list"):
    n = int(rng.integers(1000, 200000))
    return ("[" * n + "]" * n) if kind == "list" else ('{"a":' * n + "1" + "}" * n)


def odd_value(rng):
    pick = rng.integers(4)
    if pick == 0:
        return HUGE[rng.integers(len(HUGE))]
    if pick == 1:
        return ODD[rng.integers(len(ODD))]
    if pick == 2:
        return [HUGE[rng.integers(len(HUGE))]] * int(rng.integers(1, 4))
    return int(rng.integers(-5, 40))


def mutate_dict(rng, doc: dict, text_ok=True) -> str:
    """A JSON text of ``doc`` with one field changed, removed or added, or deeply nested."""
    doc = json.loads(json.dumps(doc))
    keys = list(doc)
    what = rng.integers(6)
    if what == 0 and keys:
        doc[keys[rng.integers(len(keys))]] = odd_value(rng)
    elif what == 1 and keys:
        del doc[keys[rng.integers(len(keys))]]
    elif what == 2:
        doc[f"extra{rng.integers(9)}"] = odd_value(rng)
    elif what == 3 and text_ok:
        return deep(rng, "list" if rng.integers(2) else "dict")
    elif what == 4 and keys:
        k = keys[rng.integers(len(keys))]
        doc[k] = json.loads(json.dumps(odd_value(rng)).replace("Infinity", "1e400")) \
            if rng.integers(2) else [doc[k]] * 3
    else:
        return json.dumps([doc]) if rng.integers(2) else json.dumps(doc)[: int(rng.integers(
            1, max(2, len(json.dumps(doc)))))]
    return json.dumps(doc)


# ------------------------------------------------------------------- safetensors ----
def split_safetensors(raw: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def mutate_header(rng, header: dict) -> bytes:
    header = json.loads(json.dumps(header))
    names = [k for k in header if k != "__metadata__"]
    name = names[rng.integers(len(names))]
    entry = header[name]
    what = rng.integers(11)
    if what == 0:                                     # offsets: huge, negative, swapped
        entry["data_offsets"] = [odd_value(rng), odd_value(rng)] if rng.integers(2) else \
            entry["data_offsets"][::-1]
    elif what == 1:                                   # overlapping another tensor
        other = header[names[rng.integers(len(names))]]
        entry["data_offsets"] = list(other["data_offsets"])
        if rng.integers(2):
            entry["shape"] = list(other["shape"])
            entry["dtype"] = other["dtype"]
    elif what == 2:
        entry["dtype"] = ["F64", "F32", "F16", "BF16", "U8", "I64", "BOOL", "C64", "F8_E4M3",
                          "", None, 5, ["F32"]][rng.integers(13)]
    elif what == 3:
        entry["shape"] = [[2 ** 64], [2 ** 31, 2 ** 31], [-1], [], [1.5], [[3]], "8",
                          [1] * 100, [0], [2 ** 62, 0]][rng.integers(10)]
    elif what == 4:
        return deep(rng).encode()
    elif what == 5:
        header[name] = odd_value(rng)
    elif what == 6:                                   # many tensors on one span
        for i in range(int(rng.integers(2, 3000))):
            header[f"copy{i}"] = dict(entry)
    elif what == 7:
        meta = header.get("__metadata__", {})
        if MF.ST.CONFIG_KEY in meta and rng.integers(3):
            meta[MF.ST.CONFIG_KEY] = mutate_dict(rng, json.loads(meta[MF.ST.CONFIG_KEY]))
        else:
            header["__metadata__"] = odd_value(rng) if rng.integers(2) else {"k": odd_value(rng)}
    elif what == 8:
        del entry[list(entry)[rng.integers(len(entry))]]
    elif what == 9:
        entry[["dtype", "shape", "data_offsets"][rng.integers(3)]] = odd_value(rng)
    else:
        return mutate_dict(rng, header).encode()
    return json.dumps(header).encode()


def flip_or_truncate(rng, path: Path, raw: bytes, what: int) -> str:
    """Mutations of any file: a few bit flips (``what`` 0) or a truncation (1)."""
    if what == 0:
        b = bytearray(raw)
        for _ in range(int(rng.integers(1, 9))):
            b[rng.integers(len(b))] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(b))
        return "byte flips"
    path.write_bytes(raw[:rng.integers(len(raw))])
    return "truncated"


def mutate_safetensors(rng, path: Path) -> str:
    raw = path.read_bytes()
    what = rng.integers(5)
    if what < 2:
        return flip_or_truncate(rng, path, raw, what)
    if what == 2:                                     # the header length itself
        n = [0, 1, 7, len(raw), 2 ** 63, 2 ** 64 - 1, 100 << 20][rng.integers(7)]
        path.write_bytes(struct.pack("<Q", n) + raw[8:])
        return "header length"
    header, data = split_safetensors(raw)
    head = mutate_header(rng, header)
    if rng.integers(4) == 0:                          # data section shorter or longer
        data = data[:rng.integers(len(data) + 1)] if rng.integers(2) else data + bytes(16)
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return "header fields"


# ---------------------------------------------------------------------------- npz ----
def mutate_npz(rng, path: Path) -> str:
    what = rng.integers(6)
    raw = path.read_bytes()
    if what < 2:
        return flip_or_truncate(rng, path, raw, what)
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    names = sorted(members)
    name = names[rng.integers(len(names))]
    if what == 2:                                     # the .npy header of one member
        header = {"descr": ["<f8", "|O", "<c16", "<U4", "|u1", ">f4", "<f2"][rng.integers(7)],
                  "fortran_order": bool(rng.integers(2)),
                  "shape": [(2 ** 40,), (3, 3), (), (0,), (2 ** 31, 2 ** 31), (7,)][
                      rng.integers(6)]}
        data = members[name][128:] if rng.integers(2) else bytes(int(rng.integers(0, 64)))
        members[name] = MF._npy_header(header) + data
    elif what == 3:                                   # the config inside the archive
        conf = json.loads(np_payload(members["config.json.npy"]))
        text = mutate_dict(rng, conf).encode()
        members["config.json.npy"] = MF._npy_header(
            {"descr": "|u1", "fortran_order": False, "shape": (len(text),)}) + text
    elif what == 4:
        members[["evil.pkl", "x/../y.npy", name + "x"][rng.integers(3)]] = b"\x80\x04N."
    else:
        members[name] = members[name][: rng.integers(len(members[name]) + 1)]
    method = zipfile.ZIP_DEFLATED if rng.integers(2) else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", method) as z:
        for k, v in members.items():
            z.writestr(k, v)
    return "members"


def np_payload(member: bytes) -> bytes:
    (n,) = struct.unpack("<H", member[8:10])
    return member[10 + n:]


# ---------------------------------------------------------------- HF directories ----
def mutate_hf(rng, d: Path) -> str:
    what = rng.integers(4)
    index = d / "model.safetensors.index.json"
    if what == 0:
        f = d / "config.json"
        f.write_text(mutate_dict(rng, json.loads(f.read_text())))
        return "config.json"
    if what == 1 and index.exists():
        doc = json.loads(index.read_text())
        wm = doc["weight_map"]
        k = sorted(wm)[rng.integers(len(wm))]
        wm[k] = ["../x.safetensors", "/nonexistent/a.safetensors", "", ".", "..", 5,
                 "missing.safetensors", "a\\b"][rng.integers(8)]
        index.write_text(json.dumps(doc) if rng.integers(4) else mutate_dict(rng, doc))
        return "index.json"
    files = sorted(d.glob("*.safetensors"))
    return mutate_safetensors(rng, files[rng.integers(len(files))]) + " (checkpoint)"


# ------------------------------------------------------------------------- driver ----
def one_case(src: Path, out: Path) -> tuple[str, str]:
    """('ok' | 'refused' | 'FAIL', detail) of importing ``src``."""
    from app.cli import main
    from app.cli.common import load_model_source
    try:
        load_model_source(str(src))
        outcome = "ok"
    except ValueError as exc:
        outcome, msg = "refused", str(exc)
        if "\n" in msg or not msg:
            return "FAIL", f"multi-line or empty ValueError: {msg[:500]!r}"
    except BaseException as exc:                     # noqa: BLE001 - the point of the test
        return "FAIL", "".join(traceback.format_exception_only(type(exc), exc))[-500:]
    err, sink = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(sink):
            rc = main(["import", str(src), "--out", str(out)])
    except BaseException as exc:                     # noqa: BLE001
        return "FAIL", "mpc3 import raised " + "".join(
            traceback.format_exception_only(type(exc), exc))[-500:]
    lines = err.getvalue().splitlines()
    if (outcome, rc) == ("ok", 0) and not lines:
        return "ok", ""
    if (outcome, rc) == ("refused", 2) and len(lines) == 1 and \
            lines[0].startswith("mpc3 import: error: "):
        return "refused", lines[0][:200]
    return "FAIL", f"load {outcome}, mpc3 import rc {rc}, stderr {err.getvalue()[-500:]!r}"


def build_bases(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    return {"safetensors": MF.mpc3_safetensors(root / "m.safetensors"),
            "npz": MF.mpc3_npz(root / "m.npz"),
            "bert": MF.hf_bert(root / "bert"), "bert-sharded": MF.hf_bert(root / "bert3", 3),
            "gpt2": MF.hf_gpt2(root / "gpt2")}


MUTATE = {"safetensors": mutate_safetensors, "npz": mutate_npz, "bert": mutate_hf,
          "bert-sharded": mutate_hf, "gpt2": mutate_hf}


def drive(root: Path, seed: int, cases: int) -> dict:
    bases = build_bases(root / "bases")
    report = {"ok": 0, "refused": 0, "failures": [], "slowest": 0.0, "kinds": {},
              "samples": []}
    for kind, base in bases.items():                 # the unmutated files import
        status, detail = one_case(base, root / "base-out.npz")
        if status != "ok":
            report["failures"].append(f"valid {kind}: {status} {detail}")
    t_all = time.monotonic()
    for i in range(cases):
        rng = np.random.default_rng([seed, i])
        kind = sorted(bases)[i % len(bases)]
        case = root / f"case{i}"
        src = case / bases[kind].name
        if bases[kind].is_dir():
            shutil.copytree(bases[kind], src)
        else:
            case.mkdir()
            shutil.copy(bases[kind], src)
        how = MUTATE[kind](rng, src)
        t0 = time.monotonic()
        status, detail = one_case(src, case / "out.npz")
        took = time.monotonic() - t0
        report["slowest"] = max(report["slowest"], took)
        report["kinds"].setdefault(f"{kind}: {how}", [0, 0])[status == "ok"] += 1
        if status == "refused" and len(report["samples"]) < 40:
            report["samples"].append(f"{kind}, {how}: {detail}")
        if status == "FAIL":
            report["failures"].append(f"case {i} ({kind}, {how}): {detail}")
        else:
            report[status] += 1
        if took > 30:                    # a spin, not load: a case takes ~0.05 s alone
            report["failures"].append(f"case {i} ({kind}, {how}): took {took:.1f} s")
        shutil.rmtree(case)
    report["seconds"] = time.monotonic() - t_all
    return report


def test_fuzzed_model_files_import_or_are_refused_in_one_line(tmp_path):
    r = MF.run_measured([str(tmp_path), SEED, CASES], timeout=900, address_space=2 << 30,
                        python=(str(Path(__file__)),))
    assert r["rc"] == 0, r["err"][-3000:]
    report = json.loads(r["out"].splitlines()[-1])
    assert not report["failures"], "\n".join(report["failures"][:20])
    assert report["ok"] + report["refused"] == CASES
    assert report["refused"] >= CASES // 2 and report["ok"] >= 1, report   # mutations bite
    assert r["peak_mb"] < PEAK_MB, r["peak_mb"]       # time: no assertion (a shared machine)


if __name__ == "__main__":
    rep = drive(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
    print(json.dumps(rep))
