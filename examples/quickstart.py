"""mpc3 quickstart with the Python API (docs/API.md): three MPC parties on this machine,
a model owner who shares the shipped translator and language model, and a query user who
translates numbers to words and streams a generated continuation - every job on secret
shares, the user's texts and the results never visible to any party.

    python examples/quickstart.py          (from a checkout, or with mpc3 installed)
"""
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # a checkout's packages

import app.api as mpc3api  # noqa: E402
from app.localcluster import LocalCluster  # noqa: E402
from app import textdata  # noqa: E402

TRANSLATOR = textdata.SHIPPED_MODEL       # app/assets/translator.npz
LM = textdata.SHIPPED_LM                  # app/assets/lm.npz (byte tokens)
NUMBERS = ["4096", "77", "1234"]
PROMPT = "12 = "


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="mpc3-quickstart-") as d, \
            LocalCluster(d, tied=True) as local:             # certificates, config, 3 parties
        print(f"cluster config: {local.path}")
        with mpc3api.Cluster.connect(local.path, role="model-owner") as owner:
            owner.share_model(TRANSLATOR, model_id="translator")
            owner.share_model(LM, model_id="lm", permit=["generate"])
        with mpc3api.Cluster.connect(local.path, role="query-user") as user:
            print("parties up:", [p.rank for p in user.status() if p.up])
            for m in user.models():
                print(f"model {m.model_id}: {m.kind}, permits {', '.join(m.permitted)}")
            for number, words in zip(NUMBERS, user.translate("translator", NUMBERS)):
                print(f"translate {number} -> {words}")
            print(f"translate cost: {user.last_costs}")
            print(f"generate {PROMPT!r} -> ", end="", flush=True)
            for piece in user.generate("lm", PROMPT, 24, model=LM, stream=True):
                print(piece, end="", flush=True)                # as each token arrives
            print()
            print(f"generate cost: {user.last_costs}")


if __name__ == "__main__":
    main()
