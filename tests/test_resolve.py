"""Model references: catalog names, Hugging Face ids, quantised repos, config.json paths and
a (local, fake) Hugging Face Hub. No test here touches the network."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from capsim.catalog.loader import load_catalog
from capsim.catalog.resolve import resolve_model
from capsim.cli.main import app
from capsim.errors import CapsimUserError
from capsim.notices import take_notices

CAT = load_catalog()

MISTRAL_LIKE = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 32768,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own capsim cache and no reachable Hub unless it starts one."""
    monkeypatch.setenv("CAPSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    take_notices()


@pytest.fixture
def fake_hub(monkeypatch):
    """A local stand-in for the Hub's file endpoint: /ORG/NAME/resolve/main/config.json."""
    served: dict[str, dict] = {
        "acme/Widget-8B/config.json": MISTRAL_LIKE,
        "acme/Widget-8B-FP8/config.json": {
            **MISTRAL_LIKE,
            "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"},
        },
        # ModelOpt: config.json says nothing, hf_quant_config.json beside it does
        "acme/Widget-8B-Opt/config.json": MISTRAL_LIKE,
        "acme/Widget-8B-Opt/hf_quant_config.json": {
            "producer": {"name": "modelopt", "version": "0.37.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16},
        },
        # nothing in the files: the name's ending decides
        "acme/Widget-8B-AWQ-4bit/config.json": MISTRAL_LIKE,
        # a method capsim does not know: the torch dtype, with a notice
        "acme/Widget-8B-Exotic/config.json": {
            **MISTRAL_LIKE,
            "quantization_config": {"quant_method": "exotic-q3"},
        },
    }
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            key = self.path.removeprefix("/").replace("/resolve/main/", "/")
            if key in served:
                body = json.dumps(served[key]).encode()
                self.send_response(200)
            else:
                body = b'{"error": "Entry not found"}'
                self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    yield hits
    server.shutdown()
    server.server_close()


def test_catalog_names_and_ids_resolve_to_the_same_model():
    for text in ("qwen3-8b", "Qwen/Qwen3-8B", "qwen/qwen3-8b"):
        assert resolve_model(text, CAT).name == "qwen3-8b"
        assert resolve_model(text, CAT).quant is None


def test_a_quantised_repo_names_its_model_and_format():
    ref = resolve_model("cpatonn/Qwen3-Coder-30B-A3B-Instruct-AWQ-4bit", CAT)
    assert (ref.name, ref.quant) == ("qwen3-coder-30b-a3b", "awq-int4")
    assert any("awq-int4" in n and "inferred" in n for n in take_notices())
    ref = resolve_model("Qwen/Qwen3-8B-FP8", CAT)
    assert (ref.name, ref.quant) == ("qwen3-8b", "fp8")


def test_llama_cpp_quant_tags_name_a_gguf_format():
    ref = resolve_model("unsloth/Qwen3-8B-GGUF:Q4_K_M", CAT)
    assert (ref.name, ref.quant) == ("qwen3-8b", "gguf-q4_k_m")


def test_unknown_id_offline_is_a_user_error_with_the_config_hint():
    with pytest.raises(CapsimUserError) as err:
        resolve_model("acme/Nothing-Like-It-7B", CAT)
    assert "config.json" in err.value.hint


def test_unknown_id_is_fetched_once_from_the_hub_and_cached(fake_hub):
    ref = resolve_model("acme/Widget-8B", CAT)
    assert ref.name == "acme--widget-8b" and ref.quant is None and ref.overlay is not None
    overlaid = load_catalog([ref.overlay])
    model = overlaid.model(ref.name)
    assert (model.num_layers, model.hidden_size, model.num_kv_heads) == (32, 4096, 8)
    again = resolve_model("acme/Widget-8B", CAT)
    assert again.name == ref.name
    assert len(fake_hub) == 2  # config.json and hf_quant_config.json; then the cache
    fp8 = resolve_model("acme/Widget-8B-FP8", CAT)
    assert fp8.quant == "fp8"  # from its quantization_config


def test_an_imported_checkpoint_keeps_the_format_its_files_or_its_name_state(fake_hub):
    """issue 46: a ModelOpt checkpoint states its format in hf_quant_config.json; a repo
    whose files state none is read by its name's ending; a method capsim does not know
    is simulated in the torch dtype with a notice instead of refusing the model."""
    take_notices()
    assert resolve_model("acme/Widget-8B-Opt", CAT).quant == "nvfp4"
    assert resolve_model("acme/Widget-8B-AWQ-4bit", CAT).quant == "awq-int4"
    assert "'-AWQ-4bit'" in " ".join(take_notices())
    exotic = resolve_model("acme/Widget-8B-Exotic", CAT)
    assert exotic.quant is None  # the release's own 16-bit format
    said = " ".join(take_notices())
    assert "'exotic-q3'" in said and "--quant" in said


def test_a_config_folder_with_hf_quant_config_json_beside_it(tmp_path):
    folder = tmp_path / "Widget-NVFP4"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(MISTRAL_LIKE))
    (folder / "hf_quant_config.json").write_text(
        json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}})
    )
    assert resolve_model(str(folder), CAT).quant == "fp8"


def test_a_missing_repo_on_the_hub_says_so(fake_hub):
    with pytest.raises(CapsimUserError) as err:
        resolve_model("acme/Missing-3B", CAT)
    assert "no model" in err.value.message


def test_an_id_downloaded_here_is_read_from_the_local_hugging_face_cache(tmp_path, monkeypatch):
    """A server that loaded a model by id left its config.json in the Hugging Face cache
    (models--ORG--NAME/snapshots/REV, refs/main naming REV): capsim reads it there, with
    no Hub and fetching off; the snapshot refs/main names wins over a newer one."""
    hub = tmp_path / "hub"
    repo = hub / "models--acme--Local-3B"
    for rev, hidden in (("aaa", 3072), ("bbb", 2048)):
        (repo / "snapshots" / rev).mkdir(parents=True)
        (repo / "snapshots" / rev / "config.json").write_text(
            json.dumps({**MISTRAL_LIKE, "hidden_size": hidden})
        )
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("aaa\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    ref = resolve_model("acme/Local-3B", CAT, offline=True)
    assert load_catalog([ref.overlay]).model(ref.name).hidden_size == 3072
    assert "local Hugging Face cache" in " ".join(take_notices())
    # without refs/main: the newest snapshot
    (repo / "refs" / "main").unlink()
    os.utime(repo / "snapshots" / "aaa" / "config.json", (1e9, 1e9))
    from capsim.catalog.hf_import import local_hub_config_path

    assert local_hub_config_path("acme/Local-3B").parent.name == "bbb"
    with pytest.raises(CapsimUserError, match="local Hugging Face cache"):
        resolve_model("acme/Elsewhere-3B", CAT, offline=True)


def test_config_json_path_works_offline(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(MISTRAL_LIKE))
    ref = resolve_model(str(folder / "config.json"), CAT)
    assert ref.overlay is not None
    assert load_catalog([ref.overlay]).model(ref.name).vocab_size == 32768


def test_two_config_files_side_by_side_are_two_models(tmp_path):
    """A config file not named config.json is named after itself, not its folder: two of
    them in one folder must not overwrite each other's imported entry."""
    (tmp_path / "small.config.json").write_text(json.dumps(MISTRAL_LIKE))
    (tmp_path / "wide.json").write_text(json.dumps({**MISTRAL_LIKE, "hidden_size": 8192}))
    small = resolve_model(str(tmp_path / "small.config.json"), CAT)
    wide = resolve_model(str(tmp_path / "wide.json"), CAT)
    assert small.name != wide.name
    assert load_catalog([small.overlay]).model(small.name).hidden_size == 4096
    assert load_catalog([wide.overlay]).model(wide.name).hidden_size == 8192


def test_resolving_a_config_again_keeps_its_entry_and_the_cached_catalog(tmp_path):
    """The overlay entry's modification time is part of the cached catalog's key: resolving
    the same config.json again must leave the file alone (a rewrite made every simulation
    of a stored run parse the whole catalog again), and an edited config rewrites it."""
    config = tmp_path / "m" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(MISTRAL_LIKE))
    first = resolve_model(str(config), CAT)
    entry = first.overlay / "models" / f"{first.name}.yaml"
    stamp = entry.stat().st_mtime_ns
    os.utime(entry, ns=(stamp - 10**9, stamp - 10**9))  # a rewrite would move it on
    load_catalog([first.overlay])
    cached = sorted((tmp_path / "cache").glob("catalog-*.json"))
    again = resolve_model(str(config), CAT)
    assert again.name == first.name
    assert entry.stat().st_mtime_ns == stamp - 10**9
    load_catalog([again.overlay])
    assert sorted((tmp_path / "cache").glob("catalog-*.json")) == cached  # no new parse
    config.write_text(json.dumps({**MISTRAL_LIKE, "vocab_size": 65536}))
    edited = resolve_model(str(config), CAT)
    assert load_catalog([edited.overlay]).model(edited.name).vocab_size == 65536


def test_predict_with_an_id_says_what_it_inferred():
    out = CliRunner().invoke(
        app,
        [
            "predict",
            "--gpu",
            "h100-sxm",
            "--model",
            "Qwen/Qwen3-8B-FP8",
            "--concurrency",
            "1",
            "--requests",
            "2",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    assert "fp8" in out.output
    payload = json.loads(out.stdout[out.stdout.index("{") :])
    assert payload["results"][0]["quant"] == "fp8"


def test_predict_with_an_unknown_id_offline_exits_2_with_the_hint():
    out = CliRunner().invoke(app, ["fit", "--gpu", "rtx3090", "--model", "acme/Nothing-Like-It-7B"])
    assert out.exit_code == 2
    assert "config.json" in out.output
    assert "Traceback" not in out.output


def test_an_ambiguous_gpu_family_name_picks_one_with_a_notice():
    gpu = CAT.gpus.find("h100")
    assert gpu is not None and gpu.name == "h100-sxm"
    notes = take_notices()
    if len([g for g in CAT.gpus if "h100" in [a.lower() for a in g.aliases]]) > 1:
        assert notes and "ambiguous" in notes[0]


def test_an_overlay_entry_named_as_a_built_in_alias_wins_with_a_notice(tmp_path):
    """An overlay GPU named 'h100' (the built-in H100 SXM's alias) takes the name; the
    notice says which file won and whose alias it hides (it used to be silent)."""
    from capsim.catalog.loader import builtin_db_dir

    (tmp_path / "gpus").mkdir()
    text = (builtin_db_dir() / "gpus" / "h100-sxm.yaml").read_text()
    renamed = {"name:": "name: h100", "aliases:": "aliases: []"}
    lines = [renamed.get(ln.split(" ")[0], ln) for ln in text.splitlines()]
    (tmp_path / "gpus" / "h100.yaml").write_text("\n".join(lines) + "\n")
    take_notices()
    gpu = load_catalog([tmp_path]).gpus.find("H100")
    assert gpu is not None and gpu.name == "h100"
    notes = take_notices()
    assert len(notes) == 1 and "h100-sxm" in notes[0] and "h100.yaml" in notes[0]
    # the built-in catalog's names are nobody's alias: no notice for a plain lookup
    assert CAT.gpus.find("h100-sxm") is not None and take_notices() == []


def test_gpt_oss_ggufs_are_mxfp4_experts_with_q8_0_elsewhere():
    # the ggml-org repo (a catalogued checkpoint) and the ':MXFP4' tag both mean the GGUF
    for text in ("ggml-org/gpt-oss-20b-GGUF", "ggml-org/gpt-oss-20b-GGUF:MXFP4"):
        resolved = resolve_model(text, CAT)
        assert (resolved.name, resolved.quant) == ("gpt-oss-20b", "gguf-mxfp4")
    take_notices()


def test_a_command_prints_its_own_notices_only():
    """A notice left from earlier in the process (library code that never printed, or a
    command that ended before printing) is not said again by the next command: in one
    test process it once landed in front of a --json answer."""
    from capsim.notices import notice

    notice("a stale remark from before this command")
    out = CliRunner().invoke(app, ["fit", "--gpu", "rtx3090", "--model", "qwen3-8b", "--json"])
    assert out.exit_code == 0, out.output
    assert "stale remark" not in out.output
    json.loads(out.stdout)
    assert take_notices() == []
