"""Models on a cluster, and single jobs on them.

    mpc3 share-model WEIGHTS --config C --model-id ID [--permit translate,encoder]
    mpc3 models --config C [--verify ID | --delete ID]
    mpc3 infer --config C --model-id ID --input X.npy [--output Y.npy] [--kind encoder]
    mpc3 infer --config C --model-id ID --kind classify --input X.npy     (prints logits)
    mpc3 infer --config C --model-id ID --kind classify_argmax --input X.npy  (the class)
    mpc3 import MODEL.safetensors [--model-config CFG.json] --out MODEL.npz
    mpc3 export-model translator|lm|lm-softmax|...|classifier FILE     (a shipped model)
    mpc3 import HF_DIR [--format auto|hf-bert|hf-gpt2|hf-llama|sentence-transformers]
        --out MODEL.npz [--pool mean|cls|max] [--normalize] [--max-len N]
                                                              (save_pretrained / ST directory)
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from .common import (MODEL_ID_HELP, STARTING, add_client_creds, add_import_options,
                     any_client, import_options, load, load_model_file, load_model_source)


def register(sub) -> None:
    p = sub.add_parser("share-model", help="secret-share a model's MPC weights to the parties")
    p.add_argument("weights", help="model .npz (protocols/model format), .safetensors "
                   "(mpc3 tensor names), a Hugging Face BERT / GPT-2 / LLaMA directory "
                   "(config.json + model.safetensors) or a sentence-transformers directory "
                   "(see docs/MODELS.md)")
    p.add_argument("--model-config", metavar="JSON",
                   help=".safetensors only: the model config (default: the file's metadata)")
    p.add_argument("--model-id", required=True, help=MODEL_ID_HELP)
    p.add_argument("--no-fold-omega", action="store_true",
                   help="share W^Q, W^K and Omega separately instead of W Omega")
    p.add_argument("--permit", metavar="COMPUTATIONS",
                   help="comma-separated computations query users may run (default: the "
                   "model's own inference: 'translate' for an encoder-decoder, 'classify' "
                   "for an encoder-classifier, 'generate' for a decoder-only LM, 'embed' for "
                   "an encoder; "
                   "'classify-argmax' reveals only the class; 'encoder' also returns "
                   "encoder outputs, an intermediate value of a translation model)")
    p.add_argument("--samples", metavar="FILE",
                   help="calibration inputs: .npy (B, S, d) or .npz with X and Y (default: "
                   "inputs built from the model's own embedding tables)")
    p.add_argument("--margin", type=float, default=4.0,
                   help="calibration safety margin: values must stay below each kernel's "
                   "limit / MARGIN (default 4)")
    p.add_argument("--softmax", choices=("max", "max-free"), default=None,
                   help="softmax attention's form on shares (default: the model file's, "
                   "else max): max subtracts each row's maximum (any score range); "
                   "max-free is cheaper but only for models whose scores stay in exp's "
                   "range [-48, 9.5] (calibration refuses the others)")
    p.add_argument("--secret-embeddings", action="store_true",
                   help="share the embedding tables (and an LM's head) too; users send "
                   "tokens as secret one-hot rows: a decoder-only LM returns only the next "
                   "token (generate-token), a BERT-style classifier only the class "
                   "(classify-argmax-secret; --permit classify-secret: the logits), a "
                   "headless encoder the embedding (embed-secret); mpc3 generate, classify "
                   "and embed find the mode")
    p.add_argument("--check-inputs", action="store_true",
                   help="the parties check every job's secret input against the calibrated "
                   "range on shares and refuse it if it leaves the range (a modified client "
                   "gets a refusal, not garbage; ~165 bytes and 17-18 rounds more per job, "
                   "input element counted)")
    p.add_argument("--to-diagnostic-parties", action="store_true",
                   help="share even with parties that run the diagnostic (benchmark) job "
                   "kinds, where any user can read every weight: test weights only")
    add_import_options(p)
    add_client_creds(p)
    p.set_defaults(func=_cmd_share)

    p = sub.add_parser("models", help="list the models on every party; verify or delete one")
    act = p.add_mutually_exclusive_group()
    act.add_argument("--delete", metavar="MODEL_ID", help="delete this model (model owner)")
    act.add_argument("--verify", metavar="MODEL_ID",
                     help="compare the parties' copies of every share slot of this model")
    add_client_creds(p)
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("infer", help="run one job on a shared model; writes its output")
    p.add_argument("--model-id", required=True, help=MODEL_ID_HELP)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help=".npy of the embedded input X (B, S, d)")
    src.add_argument("--ids", help="token ids of one input (comma-separated), embedded "
                     "here with the embed.src table of --model")
    p.add_argument("--model", help="model file holding the query-user tensors (with --ids)")
    p.add_argument("--output", help=".npy to write the output to (default: print it)")
    p.add_argument("--kind", default="encoder",
                   help="job kind (default: encoder; classify, classify-argmax for a "
                   "classifier; embed for an encoder; the model must permit it)")
    p.add_argument("--params", default="{}", help="public job parameters (JSON object)")
    add_client_creds(p)
    p.set_defaults(func=_cmd_infer)

    p = sub.add_parser("import", help="check a model in another format and convert it to "
                       "mpc3's .npz (or to .safetensors in mpc3 naming)")
    p.add_argument("source", help=".safetensors (mpc3 tensor names), .npz, or a directory "
                   "as Hugging Face save_pretrained (BERT, GPT-2, LLaMA) or "
                   "SentenceTransformer.save writes it")
    p.add_argument("--format", default="auto",
                   choices=("auto", "mpc3", "hf-bert", "hf-gpt2", "hf-llama",
                            "sentence-transformers"),
                   help="layout of SOURCE (default auto: a directory with modules.json as "
                   "sentence-transformers, another by its config.json's model_type, a file "
                   "as mpc3)")
    p.add_argument("--model-config", metavar="JSON",
                   help="the model config for a .safetensors source without one in its metadata")
    p.add_argument("--out", required=True, help="output .npz (with the checkpoint's "
                   "tokenizer) or .safetensors")
    add_import_options(p)
    p.set_defaults(func=_cmd_import)

    p = sub.add_parser("export-model", help="write a model shipped with mpc3 to a file, for "
                       "share-model (owner) and translate / generate --model (query user)")
    p.add_argument("name", choices=tuple(shipped_models()), help="translator (digits to "
                   "English words), lm (relu-performer LM: 'N = ' -> N's words), lm-ATTENTION "
                   "(the same LM with another attention), classifier")
    p.add_argument("file", help="output .npz")
    p.set_defaults(func=_cmd_export)


def shipped_models() -> dict[str, Path]:
    """The model files shipped in app/assets, by the names export-model takes."""
    from app import textdata as TD
    lms = {("lm" if a == "relu-performer" else f"lm-{a}"): f
           for a, f in TD.SHIPPED_LMS.items()}
    return {"translator": TD.SHIPPED_MODEL, **lms, "classifier": TD.SHIPPED_CLASSIFIER}


def _cmd_export(args) -> int:
    import shutil
    src = shipped_models()[args.name]
    if not src.exists():
        raise FileNotFoundError(f"shipped model {src} is missing (reinstall mpc3)")
    if not args.file.endswith(".npz"):
        raise ValueError(f"{args.file}: use a .npz file name (the model's format)")
    shutil.copyfile(src, args.file)
    print(f"{args.name}: {args.file} ({src.stat().st_size} bytes)")
    return 0


def _cmd_share(args) -> int:
    from app.owner import share_transformer
    from net.party.malloc import one_arena
    one_arena()       # the upload's stream and gRPC threads share one heap (net.party.malloc)
    cfg = load(args)
    from app.owner import calibration_samples, check_permit
    # user tensors are never shared
    mcfg, weights, user = load_model_file(args.weights, args.model_config,
                                          options=import_options(args))
    if args.softmax is not None and args.softmax != mcfg.softmax_form:
        if mcfg.attention != "softmax":
            raise ValueError(f"--softmax applies to softmax attention; {args.weights} has "
                             f"{mcfg.attention!r}")
        mcfg = dataclasses.replace(mcfg, softmax_form=args.softmax).validate()
    permit = [p for p in args.permit.split(",") if p] if args.permit is not None else None
    t0 = time.monotonic()
    samples = calibration_samples(mcfg, weights, user, args.samples)
    upload_id = share_transformer(cfg, args.model_id, mcfg, weights, permit, args.cert,
                                  args.key, source=Path(args.weights).name,
                                  fold_omega=not args.no_fold_omega, user=user,
                                  samples=samples, margin=args.margin,
                                  check_inputs=args.check_inputs,
                                  to_diagnostic_parties=args.to_diagnostic_parties,
                                  secret_embeddings=args.secret_embeddings)
    secret = args.secret_embeddings
    tables = "embeddings and LM head" if mcfg.arch == "decoder-only" else "embeddings"
    print(f"model {args.model_id} ({mcfg.arch}, permits "
          f"{', '.join(check_permit(permit, mcfg.arch, secret))}"
          f"{f'; {tables} secret' if secret else ''}): "
          f"{weights.n_params()} parameters calibrated and shared to "
          f"3 parties (upload {upload_id}, copies verified) in {time.monotonic() - t0:.1f} s")
    return 0


def _cmd_models(args) -> int:
    from net.client.owner import ModelOwner
    cfg = load(args)
    if args.delete:
        with ModelOwner(cfg, args.cert, args.key) as owner:
            for line in owner.delete(args.delete):
                print(f"{args.delete}: {line}")
        return 0
    with any_client(args, cfg) as cl:
        if args.verify:
            replies = cl.verify(args.verify)
            print(f"{args.verify}: verified on parties "
                  f"{[n for n, r in enumerate(replies) if r.state == 'verified']}")
            return 0
        settled = cl._settled(lambda n: list(cl._call(n, "ListModels", _list_request())
                                             .models))
    bad = 0
    per_party = []
    for n, (models, err) in enumerate(settled):
        if err is not None:
            print(f"party {n}: DOWN ({err})")
            bad += 1
            per_party.append(None)
        else:
            per_party.append({m.model_id: m for m in models})
    names = sorted(set().union(*[p for p in per_party if p is not None]))
    for model_id in names:
        infos = [p.get(model_id) if p is not None else None for p in per_party]
        held = [n for n, i in enumerate(infos) if i is not None and i.complete]
        first = next(i for i in infos if i is not None)
        problems = [f"party {n}: {i.state}" + (f" ({i.problem})" if i.problem else "")
                    for n, i in enumerate(infos) if i is not None and i.state == "corrupt"]
        refused: dict[str, list[int]] = {}        # why its jobs are refused -> parties
        for n, i in enumerate(infos):
            if i is not None and i.state != "corrupt" and i.problem:
                refused.setdefault(i.problem, []).append(n)
        problems += [f"{'parties' if len(ns) > 1 else 'party'} {', '.join(map(str, ns))}: "
                     f"{why}" for why, ns in refused.items()]
        up = [n for n in range(3) if per_party[n] is not None]
        same = len({infos[n].upload_id for n in held}) == 1 and set(held) == set(up)
        verdict = ("INCONSISTENT" if not same or len(problems) > len(refused) else
                   "NOT RUNNABLE" if refused else
                   f"OK on parties {up}, " + ", ".join(f"party {n}" for n in range(3)
                                                       if n not in up) + " not reached"
                   if len(up) < 3 else "OK")
        bad += verdict != "OK"
        states = sorted({infos[n].state for n in held})
        print(f"{model_id}: {verdict} upload={first.upload_id} "
              f"owner={first.owner} mode={_mode(first.public_meta)} tensors={len(first.tensors)} "
              f"{_size(first.total_bytes)} per party on parties {held} "
              f"state={'/'.join(states)}" + "".join(f"; {p}" for p in problems))
    if not names and not bad:
        print("no models")
    return 1 if bad else 0


def _mode(public_meta: str) -> str:
    """What a model's users hold: ``user-embeddings`` (the owner hands out the embedding
    tables and output layer), ``secret-embeddings`` (one-hot tokens in; an LM's token, a
    classifier's class or logits, an encoder's embedding out), or ``tensors``
    (not a transformer shared by share-model)."""
    import json
    try:
        meta = json.loads(public_meta or "{}")
    except ValueError:
        return "tensors"
    if not isinstance(meta, dict) or "model_config" not in meta:
        return "tensors"
    return "secret-embeddings" if meta.get("embeddings") == "secret" else "user-embeddings"


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _list_request():
    from net.proto import mpc3_pb2 as pb
    return pb.ListModelsRequest()


def _load_input(path: str) -> np.ndarray:
    try:
        x = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"input {path} not found") from None
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{path} is not a .npy array: {exc}") from None
    if x.dtype.kind not in "fiu":
        raise ValueError(f"{path}: expected a numeric array, got dtype {x.dtype}")
    return x


def _embedded_ids(args) -> np.ndarray:
    """One input of token ids embedded with the model's own table (never sent)."""
    from protocols import model as M
    from ..text import parse_ids
    if args.model is None:
        raise ValueError("--ids needs --model (the model file with embed.src)")
    mcfg, _, user = load_model_file(args.model)
    if "embed.src" not in user:
        raise ValueError(f"{args.model} holds no embed.src table to embed --ids with")
    ids = np.array([parse_ids(args.ids, mcfg.src_vocab)])
    if ids.shape[1] > mcfg.max_len:
        raise ValueError(f"--ids: {ids.shape[1]} ids; the model takes at most {mcfg.max_len}")
    return M.embed_tokens(mcfg, user, ids, table="embed.src")   # learned positions too


def job_kind(name: str) -> str:
    """Job kinds are spelt with underscores; the computation's hyphen spelling that
    ``share-model --permit`` takes (``classify-argmax``) names the same kind."""
    return name.replace("-", "_")


def _cmd_infer(args) -> int:
    from net.client.user import QueryUser
    cfg = load(args)
    try:
        params = json.loads(args.params)
    except ValueError as exc:
        raise ValueError(f"--params: {exc}") from None
    x = _embedded_ids(args) if args.ids is not None else _load_input(args.input)
    t0 = time.monotonic()
    with QueryUser(cfg, args.cert, args.key) as user:
        out = user.run(args.model_id, job_kind(args.kind), {"X": x.astype(np.float64)},
                       params)
    y = out["Y"] if "Y" in out else (next(iter(out.values())) if len(out) == 1 else None)
    if y is None:
        raise RuntimeError(f"job returned several outputs {sorted(out)} and none named 'Y'")
    took = time.monotonic() - t0
    if args.output is not None:
        np.save(args.output, y)
        print(f"{args.output}: output {y.shape} in {took:.2f} s")
        return 0
    name = next(iter(out)) if len(out) == 1 else "Y"
    for row, v in enumerate(y):
        if name == "class":
            print(f"row {row}: class {int(round(float(v)))}")
        elif name == "logits":
            print(f"row {row}: class {int(np.argmax(v))} logits "
                  f"{np.array2string(v, precision=4, max_line_width=10**6)}")
        else:
            print(f"row {row}: {np.array2string(v, precision=4, threshold=64)}")
    print(f"{args.kind}: output {name} {y.shape} in {took:.2f} s", file=sys.stderr)
    return 0


def _cmd_import(args) -> int:
    from protocols.model import save_model
    from protocols.model.safetensors import save_safetensors_model
    out = str(args.out)
    if not out.endswith((".safetensors", ".npz")):
        raise ValueError(f"--out {out}: use a .npz or .safetensors file name")
    got = load_model_source(args.source, args.model_config, args.format, import_options(args))
    mcfg, weights, user, notes = got.cfg, got.weights, got.user, list(got.notes)
    if out.endswith(".safetensors"):
        if got.tokenizer is not None or got.labels is not None:
            notes.append("the tokenizer and class names are kept in .npz model files only")
        save_safetensors_model(out, mcfg, weights, user)
    else:
        save_model(out, mcfg, weights, user or None, tokenizer=got.tokenizer,
                   labels=got.labels)
    extras = [n for n, v in (("tokenizer", got.tokenizer), ("class names", got.labels))
              if v is not None and out.endswith(".npz")]
    print(f"{args.source} -> {out}: {weights.n_params()} MPC parameters"
          f"{', query-user tensors ' + ', '.join(sorted(user)) if user else ''}"
          f"{'; its ' + ' and '.join(extras) if extras else ''}; "
          f"config {json.dumps(mcfg.to_dict(), sort_keys=True)}")
    for note in notes:
        print(f"note: {note}")
    return 0


# --------------------------------------------------------------------------- demo ----
def demo_classifier(args) -> int:
    """``mpc3 demo --model classifier``: a local cluster, the shipped encoder classifier
    shared by the owner permitting ``classify-argmax`` only (the user learns the class, not
    the logits), and held-out numbers' words classified securely (one job for all of them)
    against the plaintext arg-max."""
    from net.client.user import QueryUser
    from protocols import model as M
    from app import textdata as TD

    from ..localcluster import temporary_cluster
    from ..owner import share_transformer
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    path = TD.SHIPPED_CLASSIFIER
    if not path.exists():
        raise FileNotFoundError(f"shipped classifier {path} is missing (reinstall)")
    mcfg, w, user = M.load_model(path)
    nums = [int(n) for n in args.text] if args.text else \
        [int(n) for n in TD.sample_numbers(64, 7, "test") if n < 10000]
    nums = nums[:args.inputs]
    x = M.embed_tokens(mcfg, user, TD.classifier_input(nums))
    t_start = time.perf_counter()
    say("mpc3 demo --model classifier: the leading digit of a number, read from its English "
        "words, by an encoder classifier on three parties")
    say(STARTING)
    with temporary_cluster("mpc3-demo-clf-", args.keep_dir, peer_timeout=15.0) as cluster:
        upload = share_transformer(cluster.cfg, "classifier", mcfg, w, ["classify-argmax"],
                                   *cluster.creds("owner"), source=path.name, user=user)
        say(f"model owner: shared the shipped classifier {path.name} ({w.n_params()} "
            f"parameters, d_model {mcfg.d_model}, {mcfg.n_enc_layers} layers, "
            f"{mcfg.n_classes} classes) as upload {upload}, permitting classify-argmax only")
        with QueryUser(cluster.cfg, *cluster.creds("user"), rpc_timeout=30) as qu:
            t0 = time.perf_counter()
            got = np.rint(qu.run("classifier", "classify_argmax", {"X": x})["class"])
            took = time.perf_counter() - t0
    ref = M.ref_classify(mcfg, w, x).argmax(-1)
    for n, g, r in zip(nums, got.astype(int), ref):
        print(f"{TD.number_to_words(n)!r}: class {g}"
              + ("" if g == r else f"   (plaintext: {r})"))
    agree = int(np.sum(got == ref))
    right = sum(int(g) == TD.leading_digit(n) for g, n in zip(got, nums))
    print(f"agreement with the plaintext model: {agree}/{len(nums)}; correct leading digits: "
          f"{right}/{len(nums)}; one classify_argmax job of {len(nums)} rows took {took:.1f} s; "
          f"demo finished in {time.perf_counter() - t_start:.1f} s")
    return 0 if agree == len(nums) else 1
