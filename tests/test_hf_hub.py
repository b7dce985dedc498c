"""Save / load / Hub round trips of the native family: safetensors round trip, auto_map, the
generated remote code loading in a fresh process where our packages cannot be imported, and
push_to_hub → from_pretrained through the real huggingface_hub client against a local HTTP Hub
endpoint started by the test (loopback only)."""
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.clean_process import run_clean
from helpers.code_blocks import run_as_module
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

import hf_momentum
from hf_momentum.flatten import GENERATED_MARK, flatten_modules

REPO = Path(__file__).resolve().parents[1]
LSTM_AUTO_CLASSES = {"AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification",
                     "AutoModelForTokenClassification", "AutoModelForQuestionAnswering"}
TRANSFORMER_AUTO_CLASSES = LSTM_AUTO_CLASSES | {"AutoModelForMaskedLM"}   # an LSTM reads one direction


def tiny_config(**kwargs):
    base = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=64, hidden_dropout=0.0,
                attention_momentum=0.4, attention_step_size=0.7, connection="adaptive",
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
    base.update(kwargs)
    return AutoConfig.for_model("momentum_transformer", **base)


def sample_ids():
    return torch.arange(3, 3 + 2 * 9).remainder(97).add(3).view(2, 9)


def test_flatten_bundle_is_self_contained_and_refuses_collisions():
    text = flatten_modules(("plugins.attention.api",), ("momentum_attention",))
    assert GENERATED_MARK in text and "from ." not in text and "import plugins" not in text
    namespace = run_as_module(text, "bundle")
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    from plugins.attention import momentum_attention
    torch.testing.assert_close(namespace["momentum_attention"](q, q, q, momentum=0.3),
                               momentum_attention(q, q, q, momentum=0.3))
    with pytest.raises(ValueError, match="'BACKENDS' is defined in both"):
        flatten_modules(("plugins.attention.api", "plugins.rnn.layers"), ())


@pytest.mark.parametrize("auto_class, kwargs", [
    (AutoModelForCausalLM, {}), (AutoModel, {}), (AutoModelForSequenceClassification, dict(is_causal=False)),
    (AutoModelForTokenClassification, dict(is_causal=False)),
    (AutoModelForQuestionAnswering, dict(is_causal=False)), (AutoModelForMaskedLM, dict(is_causal=False)),
])
def test_save_load_round_trip_is_exact(auto_class, kwargs, tmp_path):
    torch.manual_seed(0)
    model = auto_class.from_config(tiny_config(**kwargs)).eval()
    model.save_pretrained(tmp_path)
    files = set(os.listdir(tmp_path))
    assert {"config.json", "model.safetensors", "README.md", "modeling_momentum_transformer.py",
            "configuration_momentum_transformer.py", "momentum_core.py", "recurrent_cache.py",
            "saving.py", "modeling_common.py", "validation.py"} <= files
    assert GENERATED_MARK in (tmp_path / "validation.py").read_text()
    config = json.loads((tmp_path / "config.json").read_text())
    assert set(config["auto_map"]) == TRANSFORMER_AUTO_CLASSES
    assert GENERATED_MARK in (tmp_path / "momentum_core.py").read_text()
    card = (tmp_path / "README.md").read_text()
    assert "attention_momentum" in card and "0.4" in card and "Momentum Transformer" in card
    loaded = auto_class.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    with torch.no_grad():
        out, again = model(input_ids=sample_ids()), loaded(input_ids=sample_ids())
    names = [name for name in ("logits", "start_logits", "end_logits", "last_hidden_state") if name in out]
    assert names
    for name in names:
        torch.testing.assert_close(again[name], out[name], rtol=0, atol=0)


def lstm_config():
    return AutoConfig.for_model("momentum_lstm", vocab_size=100, hidden_size=16, num_hidden_layers=2,
                                cell="sr", restart=4, step_size=0.5, pad_token_id=0, initializer_range=0.5)


@pytest.mark.parametrize("make_config", [tiny_config, lstm_config], ids=["transformer", "lstm"])
def test_remote_code_loads_in_a_clean_process(make_config, tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config()).eval()
    model.save_pretrained(tmp_path / "saved")
    with torch.no_grad():
        logits = model(input_ids=sample_ids()).logits
        tokens = model.generate(sample_ids(), max_new_tokens=5, do_sample=False, pad_token_id=0)
    torch.save({"logits": logits, "tokens": tokens}, tmp_path / "expected.pt")
    isolated = tmp_path / "isolated"
    shutil.copytree(tmp_path / "saved", isolated / "model")
    shutil.copy(tmp_path / "expected.pt", isolated / "expected.pt")
    proc = run_clean("""
        import torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("model", trust_remote_code=True).eval()
        expected = torch.load("expected.pt")
        ids = torch.arange(3, 3 + 2 * 9).remainder(97).add(3).view(2, 9)
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids=ids).logits, expected["logits"], rtol=0, atol=0)
            tokens = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
            if model.config.model_type == "momentum_transformer":   # the compileable cache travels too
                static = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0,
                                        cache_implementation="static")
                assert torch.equal(static, expected["tokens"])
        assert torch.equal(tokens, expected["tokens"])
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        assert type(model).__name__ in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()   # smoothing shifts
        model.save_pretrained("resaved")
        try:
            AutoModelForCausalLM.from_pretrained("model", trust_remote_code=True,
                                                 initializer_range=float("inf"))
            raise SystemExit("a non-finite override was accepted")
        except ValueError as error:
            assert "initializer_range" in str(error), error
        print("OK", type(model).__module__)
    """, isolated, {"HF_HUB_OFFLINE": "1"})
    assert "OK transformers_modules" in proc.stdout
    for core in ("momentum_core.py", "momentum_rnn_core.py", "validation.py"):
        if (isolated / "model" / core).exists():
            assert (isolated / "resaved" / core).read_text() == (isolated / "model" / core).read_text()


@pytest.mark.parametrize("auto_class, make_config, auto_classes", [
    (AutoModelForSequenceClassification, lstm_config, LSTM_AUTO_CLASSES),
    (AutoModelForTokenClassification, lstm_config, LSTM_AUTO_CLASSES),
    (AutoModelForQuestionAnswering, lstm_config, LSTM_AUTO_CLASSES),
    (AutoModelForMaskedLM, lambda: tiny_config(is_causal=False), TRANSFORMER_AUTO_CLASSES),
], ids=["lstm-sequence", "lstm-token", "lstm-span", "transformer-masked"])
def test_task_heads_remote_code_loads_in_a_clean_process(auto_class, make_config, auto_classes, tmp_path):
    """The LSTM's heads (sequence and token classifiers, question answering; hidden states through
    the layer-by-layer path) and the transformer's masked LM save an auto_map entry for every Auto
    class of their family and load with their remote code where our packages cannot be imported."""
    torch.manual_seed(0)
    model = auto_class.from_config(make_config()).eval()
    model.save_pretrained(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert set(config["auto_map"]) == auto_classes
    with torch.no_grad():
        out = model(input_ids=sample_ids(), output_hidden_states=True)
    logits = [out[name] for name in ("logits", "start_logits", "end_logits") if name in out]
    torch.save({"logits": logits, "hidden": out.hidden_states}, tmp_path / "expected.pt")
    proc = run_clean(f"""
        import torch
        from transformers import {auto_class.__name__}
        model = {auto_class.__name__}.from_pretrained("model", trust_remote_code=True).eval()
        expected = torch.load("expected.pt")
        ids = torch.arange(3, 3 + 2 * 9).remainder(97).add(3).view(2, 9)
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
        logits = [out[name] for name in ("logits", "start_logits", "end_logits") if name in out]
        assert len(logits) == len(expected["logits"]) > 0
        for got, want in zip(logits, expected["logits"]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert len(out.hidden_states) == len(expected["hidden"]) == 3
        for got, want in zip(out.hidden_states, expected["hidden"]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        print("OK", type(model).__name__, type(model).__module__)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert f"OK {type(model).__name__} transformers_modules" in proc.stdout


class LocalHub(BaseHTTPRequestHandler):
    """The few Hub API routes push_to_hub and from_pretrained use, backed by a dict."""

    repos: dict = {}

    def log_message(self, *args):
        pass

    def _send(self, status, body=b"", headers=None, head=False):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _body(self):
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def do_POST(self):
        path = unquote(urlparse(self.path).path)
        parts = path.strip("/").split("/")
        if path == "/api/repos/create":
            payload = json.loads(self._body())
            repo_id = f"{payload.get('organization') or 'user'}/{payload['name']}"
            self.repos.setdefault(repo_id, {"files": {}, "sha": "0" * 40})
            return self._send(200, {"url": f"http://{self.headers['Host']}/{repo_id}", "name": repo_id})
        if path == "/api/validate-yaml":
            self._body()
            return self._send(200, {"errors": [], "warnings": []})
        if parts[:2] == ["api", "models"] and parts[4] == "preupload":
            files = json.loads(self._body())["files"]
            return self._send(200, {"files": [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]})
        if parts[:2] == ["api", "models"] and parts[4] == "commit":
            repo = self.repos[f"{parts[2]}/{parts[3]}"]
            for line in self._body().decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    repo["files"][item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            repo["sha"] = hashlib.sha1(repr(sorted(repo["files"].items())).encode()).hexdigest()
            return self._send(200, {"commitUrl": f"http://{self.headers['Host']}/{parts[2]}/{parts[3]}/commit/"
                                                 f"{repo['sha']}",
                                    "commitOid": repo["sha"], "pullRequestUrl": None})
        self._send(404, {"error": f"unsupported {path}"})

    def do_HEAD(self):
        self.do_GET(head=True)

    def do_GET(self, head=False):
        path = unquote(urlparse(self.path).path)
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo = self.repos.get(f"{parts[2]}/{parts[3]}")
            if repo is None:
                return self._send(404, {"error": "no repo"}, {"X-Error-Code": "RepoNotFound"}, head)
            return self._send(200, {"id": f"{parts[2]}/{parts[3]}", "sha": repo["sha"], "private": False,
                                    "siblings": [{"rfilename": f} for f in repo["files"]]}, head=head)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self.repos.get(f"{parts[0]}/{parts[1]}")
            if repo is None:
                return self._send(404, {"error": "no repo"}, {"X-Error-Code": "RepoNotFound"}, head)
            data = repo["files"].get("/".join(parts[4:]))
            if data is None:
                return self._send(404, {"error": "no entry"}, {"X-Error-Code": "EntryNotFound",
                                                               "X-Repo-Commit": repo["sha"]}, head)
            return self._send(200, data, {"X-Repo-Commit": repo["sha"],
                                          "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}, head)
        self._send(404, {"error": f"unsupported {path}"}, head=head)


@pytest.fixture
def local_hub():
    LocalHub.repos = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), LocalHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_push_to_hub_then_from_pretrained_with_remote_code(local_hub, tmp_path):
    env = {"HF_ENDPOINT": local_hub, "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": "hf_local_test_token",
           "HF_HUB_OFFLINE": "0", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    pusher = dict(os.environ, **env, HF_HOME=str(tmp_path / "push_home"), PYTHONPATH=str(REPO))
    push = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import torch, hf_momentum
        from transformers import AutoConfig, AutoModelForCausalLM
        torch.manual_seed(0)
        config = AutoConfig.for_model("momentum_transformer", vocab_size=100, hidden_size=32,
                                      num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                      max_position_embeddings=64,
                                      attention_momentum=0.4, connection="momentum", hidden_dropout=0.0)
        model = AutoModelForCausalLM.from_config(config).eval()
        model.push_to_hub("user/tiny-momentum")
        ids = torch.arange(3, 3 + 2 * 9).remainder(97).add(3).view(2, 9)
        with torch.no_grad():
            torch.save(model(input_ids=ids).logits, "expected.pt")
    """)], cwd=tmp_path, env=pusher, capture_output=True, text=True, timeout=300)
    assert push.returncode == 0, push.stdout + push.stderr
    files = LocalHub.repos["user/tiny-momentum"]["files"]
    assert {"config.json", "model.safetensors", "README.md", "modeling_momentum_transformer.py",
            "momentum_core.py"} <= set(files)
    card = files["README.md"].decode()
    assert "@inproceedings" in card and "| `attention_momentum` | 0.4 |" in card
    proc = run_clean("""
        import torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("user/tiny-momentum", trust_remote_code=True).eval()
        ids = torch.arange(3, 3 + 2 * 9).remainder(97).add(3).view(2, 9)
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids=ids).logits, torch.load("expected.pt"), rtol=0, atol=0)
        print("PULLED", model.config.connection)
    """, tmp_path, env)
    assert "PULLED momentum" in proc.stdout


def stock_llama(attn_implementation, **hyperparameters):
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", vocab_size=100, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    if hyperparameters:
        hf_momentum.set_momentum_attention(config, **hyperparameters)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).eval()


def test_stock_model_records_and_restores_momentum_attention(tmp_path):
    model = stock_llama("momentum", momentum=0.3, step_size=0.7, feature_map="relu")
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["attn_implementation"] == hf_momentum.attention_interface.RECORDED_NAMES["momentum"]
    assert (saved["attention_momentum"], saved["attention_step_size"], saved["attention_feature_map"]) == \
        (0.3, 0.7, "relu")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    softmax = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    with torch.no_grad():
        expected = model(input_ids=sample_ids()).logits
        torch.testing.assert_close(loaded(input_ids=sample_ids()).logits, expected, rtol=0, atol=0)
        assert not torch.allclose(softmax(input_ids=sample_ids()).logits, expected, atol=1e-3)
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["attn_implementation"] == \
        saved["attn_implementation"]


def test_stock_model_records_default_hyperparameters_of_linear_attention(tmp_path):
    model = stock_llama("linear_attention")
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["attn_implementation"].startswith("linear_attention ")
    assert saved["attention_feature_map"] == "elu"
    assert "attention_momentum" not in saved
    sdpa = stock_llama("sdpa")
    sdpa.save_pretrained(tmp_path / "sdpa")
    assert "attn_implementation" not in json.loads((tmp_path / "sdpa" / "config.json").read_text())
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=sample_ids()).logits,
                                   model(input_ids=sample_ids()).logits, rtol=0, atol=0)


def test_stock_model_without_the_package_refuses_to_load(tmp_path):
    stock_llama("momentum", momentum=0.3).save_pretrained(tmp_path / "model")
    proc = run_clean("""
        from transformers import AutoModelForCausalLM
        try:
            AutoModelForCausalLM.from_pretrained("model")
            raise SystemExit("loaded without hf_momentum")
        except ValueError as error:
            print("REFUSED", error)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "REFUSED" in proc.stdout
    assert "pip install momentum-plugins" in proc.stdout and "import hf_momentum" in proc.stdout


def test_flatten_points_nested_fast_path_imports_at_the_installed_package():
    """The Triton paths are imported inside functions; the bundle names the installed package there
    (inside a try block, so transformers' remote-code check does not require it) and keeps no
    relative import that transformers would try to copy as a sibling file."""
    for roots, line in ((("plugins.attention.api",), "from plugins.attention import triton as kernels"),
                        (("plugins.rnn.layers",), "from plugins.rnn.adam_recurrence_triton import")):
        text = flatten_modules(roots, ())
        assert "from ." not in text and line in text
