"""The Python package's tests (plain unittest), run by tests/python/run in a venv where the
repository was `pip install`ed with the prebuilt program: the API against the program installed in
the package, and the preflight with a fake DeepSpeed engine and faked installed versions.

Environment: HPZLAB_REPO, the repository (its test data); HPZLAB_PREBUILT, the program that was
put into the package.
"""
from __future__ import annotations

import copy
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import unittest
import warnings
from unittest import mock

import hpzlab

REPO = pathlib.Path(os.environ.get("HPZLAB_REPO", pathlib.Path(__file__).resolve().parents[2]))
DATA = REPO / "tools" / "recorder" / "tests" / "data"
CI = REPO / "tests" / "data" / "ci"
DS_7B = DATA / "ds-7b-defaults.json"
LLAMA_7B = DATA / "llama-2-7b.json"
TINY = json.loads((CI / "config.json").read_text())
RACY = json.loads((CI / "ds_config-racy.json").read_text())

HPZ_RACE = "race: secondary_partition_copy vs prefetch, on the secondary"


def racy_hpz8() -> dict:
    """The tiny model's racy config with hpZ 8 and overlap_comm on (16 ranks, 8 per node)."""
    ds = copy.deepcopy(RACY)
    ds["zero_optimization"]["zero_hpz_partition_size"] = 8
    ds["zero_optimization"]["overlap_comm"] = True
    return ds


class TestInstalled(unittest.TestCase):
    def test_the_installed_package_and_its_program_are_used(self):
        self.assertNotIn("HPZLAB_BINARY", os.environ)
        package = pathlib.Path(hpzlab.__file__).resolve().parent
        self.assertTrue(str(package).startswith(os.path.realpath(sys.prefix)),
                        f"{package} is not in the venv {sys.prefix}")
        program = pathlib.Path(hpzlab.binary())
        self.assertEqual(program, package / "bin" / "hpzlab")
        self.assertTrue(os.access(program, os.X_OK))
        prebuilt = os.environ.get("HPZLAB_PREBUILT")
        if prebuilt:
            self.assertEqual(program.stat().st_size, pathlib.Path(prebuilt).stat().st_size)
        out = subprocess.run([str(program), "--version"], capture_output=True, text=True,
                             check=True).stdout
        # The package's version is project()'s VERSION, the program's.
        version = re.search(r"project\(hpzlab VERSION ([0-9.]+)",
                            (REPO / "CMakeLists.txt").read_text()).group(1)
        self.assertEqual(hpzlab.__version__, version)
        self.assertIn(version, out)

    def test_binary_env_overrides(self):
        with mock.patch.dict(os.environ, {"HPZLAB_BINARY": "/nonexistent/hpzlab"}):
            with self.assertRaisesRegex(hpzlab.HpzlabError, "HPZLAB_BINARY=/nonexistent"):
                hpzlab.binary()
        program = hpzlab.binary()
        with mock.patch.dict(os.environ, {"HPZLAB_BINARY": program}):
            self.assertEqual(hpzlab.binary(), program)

    def test_import_imports_neither_transformers_nor_torch(self):
        code = ("import sys; import hpzlab; "
                "bad = [m for m in ('transformers', 'torch', 'deepspeed') if m in sys.modules]; "
                "sys.exit(str(bad) if bad else 0)")
        subprocess.run([sys.executable, "-c", code], check=True)

    def test_build_requirements_are_pyproject_pins(self):
        import tomllib  # Python 3.11, as Debian 12's
        pins = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
        unconditional = sorted(p for p in pins if ";" not in p)
        locked = sorted(line.split()[0] for line in
                        (REPO / "python" / "build-requirements.txt").read_text().splitlines()
                        if re.match(r"^[A-Za-z]", line))
        self.assertEqual(unconditional, locked)
        self.assertTrue(all("==" in p for p in pins), pins)


class TestCheck(unittest.TestCase):
    def test_llama_7b_races_on_0_13_4_and_is_clean_on_0_13_5(self):
        r = hpzlab.check(ds_config=DS_7B, hf_config=LLAMA_7B, nodes=2, gpus_per_node=8,
                         deepspeed="0.13.4,0.13.5")
        self.assertFalse(r.clean)
        self.assertEqual(r.returncode, 1)
        racy, clean = r.verdict("0.13.4"), r.verdict("0.13.5")
        self.assertTrue(racy.checked)
        self.assertFalse(racy.clean)
        self.assertGreater(racy.counts.get("race", 0), 0)
        self.assertTrue(racy.findings)
        self.assertTrue(all(f.kind == "race" and f.release == "0.13.4" for f in racy.findings))
        self.assertEqual({f.signature for f in racy.findings}, {HPZ_RACE})
        self.assertEqual(sum(f.count for f in racy.findings), racy.counts["race"])
        self.assertTrue(clean.checked and clean.clean)
        self.assertEqual(clean.counts, {})
        self.assertEqual(clean.findings, [])
        self.assertEqual(set(r.releases), {"0.13.4", "0.13.5"})
        self.assertEqual(list(r.clean_in.values()), [["0.13.5"]])
        self.assertEqual([(h["signature"], h["fixed_in"]) for h in r.history],
                         [(HPZ_RACE, "0.13.5")])
        self.assertIn("clean in: 0.13.5", r.text)

    def test_one_release_from_dicts_is_explained(self):
        r = hpzlab.check(ds_config=RACY, hf_config=TINY, nodes=2, gpus_per_node=2,
                         deepspeed="0.13.4")
        self.assertFalse(r.clean)
        self.assertEqual([v.release for v in r.verdicts], ["0.13.4"])
        f = r.findings[0]
        self.assertEqual(f.signature, HPZ_RACE)
        self.assertTrue(f.detail and f.fix and f.ranks and f.first["stream"])
        # The text of one release explains each group: the README's words.
        self.assertIn("hpZ race fixed in DeepSpeed v0.13.5", r.explanation)
        self.assertIn("fix:", r.explanation)
        self.assertTrue(f.remedy.startswith("upgrade DeepSpeed to 0.18.3 or later"), f.remedy)
        self.assertIn("to do:", r.explanation)

    def test_gradient_hooks_on_a_side_stream_race_before_0_18_8(self):
        # DeepSpeed issue 7898: with torch 2.10 a gradient hook runs on the stream the script
        # issues the step from, and 0.18.7's reduce stream waits on the default stream.
        r = hpzlab.check(ds_config=RACY, hf_config=TINY, nodes=2, gpus_per_node=2,
                         deepspeed="0.18.7,0.18.8", torch="2.10.0", step_stream="side")
        self.assertFalse(r.clean, r.text)
        self.assertIn("--step-stream", r.argv)
        by_release = r.releases
        self.assertGreater(by_release["0.18.7"].counts.get("race", 0), 0, r.text)
        self.assertTrue(by_release["0.18.8"].clean, r.text)
        on_default = hpzlab.check(ds_config=RACY, hf_config=TINY, nodes=2, gpus_per_node=2,
                                  deepspeed="0.18.7", torch="2.10.0")
        self.assertTrue(on_default.clean, on_default.text)

    def test_explain_says_what_orders_a_clean_release(self):
        # 0.13.5 syncs the host after each secondary copy (PR 5216): without that sync it races.
        r = hpzlab.check(ds_config=RACY, hf_config=TINY, nodes=2, gpus_per_node=2,
                         deepspeed="0.13.5", explain=True)
        self.assertTrue(r.clean, r.text)
        self.assertIn("--explain", r.argv)
        self.assertEqual(len(r.why_clean), 1)
        guards = r.why_clean[0]["guards"]
        self.assertEqual([g["purpose"] for g in guards], ["fix_host_sync"])
        self.assertTrue(guards[0]["deepspeed_fix"])
        self.assertGreater(guards[0]["races_without"], 0)
        self.assertIn("why clean:", r.text)
        self.assertEqual(hpzlab.check(ds_config=RACY, hf_config=TINY, nodes=2, gpus_per_node=2,
                                      deepspeed="0.13.5").why_clean, [])

    def test_set_overrides_a_key(self):
        r = hpzlab.check(ds_config=RACY, hf_config=TINY, nodes=2, gpus_per_node=2,
                         deepspeed=["0.13.4"], set={"zero.overlap_comm": False})
        self.assertTrue(r.clean, r.text)
        self.assertEqual(r.returncode, 0)

    def test_a_known_deepspeed_defect_makes_a_release_unclean(self):
        # qwZ on bf16: DeepSpeed's quantizer reads the shard as fp16 before 0.19.6 (PR 8215).
        ds = copy.deepcopy(RACY)
        ds["zero_optimization"]["zero_quantized_weights"] = True
        ds["bf16"] = {"enabled": True}
        ds.pop("fp16", None)
        hf = json.loads((DATA / "llama-tiny-h128.json").read_text())
        r = hpzlab.check(ds_config=ds, hf_config=hf, nodes=2, gpus_per_node=2,
                         deepspeed="0.19.5,0.19.6")
        old, new = r.verdict("0.19.5"), r.verdict("0.19.6")
        self.assertEqual(old.defects, ["qwz-quantizer-reads-half"])
        self.assertFalse(old.clean)
        self.assertEqual((new.defects, new.clean), ([], True))
        self.assertEqual(r.returncode, 1)
        one = hpzlab.check(ds_config=ds, hf_config=hf, nodes=2, gpus_per_node=2,
                           deepspeed="0.19.5")
        self.assertEqual(one.verdict("0.19.5").defects, ["qwz-quantizer-reads-half"])
        self.assertFalse(one.clean or one.verdict("0.19.5").clean)
        self.assertIn("DeepSpeed defect `qwz-quantizer-reads-half`", one.text)
        # The preflight's warning says it, with the release that fixes it.
        message = sys.modules["hpzlab.preflight"]._message(one)
        self.assertIn("DeepSpeed 0.19.5 with this config has the defect qwz-quantizer-reads-half",
                      message)
        self.assertIn("upgrade DeepSpeed to 0.19.6 or later.", message)
        self.assertNotIn("ordering bugs ()", message)

    def test_a_bad_key_raises_the_programs_one_line(self):
        ds = copy.deepcopy(RACY)
        ds["zero_optimization"]["zero_hpz_partition_sizee"] = 8
        with self.assertRaises(hpzlab.HpzlabError) as caught:
            hpzlab.check(ds_config=ds, hf_config=TINY, nodes=2, gpus_per_node=2,
                         deepspeed="0.13.4")
        e = caught.exception
        self.assertEqual(e.returncode, 2)
        message = str(e)
        self.assertNotIn("\n", message)
        self.assertRegex(message, r"^hpzlab: error: .*ds_config\.json: "
                                  r"zero_optimization\.zero_hpz_partition_sizee: unknown key")
        self.assertIn("did you mean 'zero_hpz_partition_size'", message)

    def test_a_missing_file_raises(self):
        with self.assertRaisesRegex(hpzlab.HpzlabError, "^hpzlab: error: .*nope.json"):
            hpzlab.check(ds_config="nope.json", hf_config=TINY)


    def test_a_crash_or_an_internal_error_raises(self):
        with tempfile.TemporaryDirectory() as tmp:
            for body, expected, rc in (
                    ('echo "hpzlab: internal error (please report): x" >&2; exit 70',
                     "hpzlab: internal error (please report): x", 70),
                    ('echo "double free" >&2; kill -ABRT $$',
                     "hpzlab killed by SIGABRT: double free", -6)):
                fake = pathlib.Path(tmp) / "hpzlab"
                fake.write_text(f"#!/bin/sh\n{body}\n")
                fake.chmod(0o755)
                with mock.patch.dict(os.environ, {"HPZLAB_BINARY": str(fake)}):
                    with self.assertRaises(hpzlab.HpzlabError) as caught:
                        hpzlab.check(ds_config=RACY, hf_config=TINY)
                self.assertEqual((str(caught.exception), caught.exception.returncode),
                                 (expected, rc))


class TestSim(unittest.TestCase):
    def test_sim_of_the_racy_config(self):
        s = hpzlab.sim(ds_config=RACY, hf_config=TINY, nodes=2, gpus_per_node=2,
                       deepspeed="0.13.4", runs=2)
        self.assertEqual(s.returncode, 0)
        self.assertFalse(s.hung)
        self.assertEqual(s.world_size, 4)
        self.assertGreater(s.step_time_s, 0)
        self.assertGreater(s.tokens_per_s_per_node, 0)
        self.assertEqual(len(s.runs), 2)
        self.assertTrue(s.races)
        self.assertIn("step time", s.text)

    def test_a_faster_network_is_the_cluster_the_times_assume(self):
        slow = hpzlab.sim(ds_config=RACY, hf_config=TINY, nodes=2, gpus_per_node=2,
                          deepspeed="0.13.5")
        fast = hpzlab.sim(ds_config=RACY, hf_config=TINY, nodes=2, gpus_per_node=2,
                          deepspeed="0.13.5", nic_gbps=400, nics_per_node=2)
        self.assertEqual((fast.cluster["nic_gbps"], fast.cluster["nics_per_node"]), (400, 2))
        self.assertNotEqual(slow.cluster["nic_gbps"], 400)
        self.assertIn("--nic-gbps", fast.argv)
        self.assertIn("2 x 400 Gbit/s NIC per node", fast.text)
        self.assertLess(fast.step_time_s, slow.step_time_s)


class FakeDeepSpeedConfig:
    """DeepSpeedConfig's one attribute preflight reads: the parsed dict (runtime/config.py)."""

    def __init__(self, param_dict):
        self._param_dict = param_dict


class FakeHFConfig:
    def __init__(self, d):
        self._d = d

    def to_dict(self):
        return dict(self._d)


class FakeModel:
    def __init__(self, d):
        self.config = FakeHFConfig(d)


class FakeEngine:
    """Where DeepSpeedEngine keeps the user's config (engine.py: self.config, self._config) and
    the model (self.module)."""

    def __init__(self, ds_config, model_config):
        self.config = ds_config
        self._config = FakeDeepSpeedConfig(ds_config)
        self.module = FakeModel(model_config)


def v(deepspeed, torch="2.1.2"):
    return {"deepspeed": deepspeed, "torch": torch, "transformers": "4.35.2"}


class TestPreflight(unittest.TestCase):
    def run_preflight(self, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = hpzlab.preflight(**kwargs)
        return result, [w for w in caught if issubclass(w.category, hpzlab.HpzlabWarning)]

    def test_warns_on_0_13_4_with_hpz_8_and_overlap_comm(self):
        engine = FakeEngine(racy_hpz8(), TINY)
        result, caught = self.run_preflight(engine=engine, world_size=16, gpus_per_node=8,
                                            versions=v("0.13.4"))
        self.assertFalse(result.clean)
        self.assertEqual([x.release for x in result.verdicts], ["0.13.4"])
        self.assertEqual(len(caught), 1)
        message = str(caught[0].message)
        self.assertIn("DeepSpeed 0.13.4", message)
        self.assertIn("hpZ race", message)
        self.assertIn("upgrade DeepSpeed to 0.18.3 or later", message)
        self.assertIn("zero_hpz_partition_size to 1", message)
        # One sentence for the kind, with all its groups' findings.
        self.assertEqual(message.count("hpZ race"), 1)
        self.assertIn(f"({result.verdicts[0].counts['race']} times, layers 0-1)", message)
        # The run's shape and the installed releases reached the program.
        argv = result.argv
        for flag, value in (("--nodes", "2"), ("--gpus-per-node", "8"),
                            ("--deepspeed", "0.13.4"), ("--torch", "2.1.2")):
            self.assertEqual(argv[argv.index(flag) + 1], value)

    def test_silent_on_0_13_5(self):
        engine = FakeEngine(racy_hpz8(), TINY)
        result, caught = self.run_preflight(engine=engine, world_size=16, gpus_per_node=8,
                                            versions=v("0.13.5"))
        self.assertTrue(result.clean, result.text)
        self.assertEqual(caught, [])

    def test_raises_with_action_raise(self):
        engine = FakeEngine(racy_hpz8(), TINY)
        with self.assertRaises(hpzlab.HpzlabPreflightError) as caught:
            hpzlab.preflight(engine, world_size=16, gpus_per_node=8, versions=v("0.13.4"),
                             action="raise")
        self.assertIsInstance(caught.exception, hpzlab.HpzlabError)
        self.assertFalse(caught.exception.result.clean)
        self.assertIn("hpZ race", str(caught.exception))

    def test_version_lookup_and_environment(self):
        # A local version suffix is the release; WORLD_SIZE and LOCAL_WORLD_SIZE give the shape.
        engine = FakeEngine(racy_hpz8(), TINY)
        with mock.patch.dict(os.environ, {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}):
            result, caught = self.run_preflight(
                engine=engine, version_lookup=lambda: v("0.13.4+cu121", "2.1.2+cu121"))
        argv = result.argv
        self.assertEqual(argv[argv.index("--deepspeed") + 1], "0.13.4")
        self.assertEqual(argv[argv.index("--nodes") + 1], "2")
        self.assertEqual(len(caught), 1)

    def test_engine_holding_only_a_path(self):
        # An engine whose DeepSpeedConfig is not there: its `config` (what the user gave) is read.
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "ds.json"
            path.write_text(json.dumps(racy_hpz8()))
            engine = FakeEngine(str(path), TINY)
            del engine._config
            result, caught = self.run_preflight(engine=engine, world_size=16, gpus_per_node=8,
                                                versions=v("0.13.5"))
        self.assertTrue(result.clean)

    def test_a_run_hpzlab_cannot_model_warns_or_raises(self):
        ds = racy_hpz8()
        ds["zero_optimization"]["zero_hpz_partition_size"] = 3  # divides no world of 16
        engine = FakeEngine(ds, TINY)
        result, caught = self.run_preflight(engine=engine, world_size=16, gpus_per_node=8,
                                            versions=v("0.13.4"))
        self.assertIsNone(result)
        self.assertEqual(len(caught), 1)
        self.assertIn("hpzlab could not check this run: hpzlab: error:", str(caught[0].message))
        with self.assertRaises(hpzlab.HpzlabError):
            hpzlab.preflight(engine, world_size=16, gpus_per_node=8, versions=v("0.13.4"),
                             action="raise")

    def test_nothing_to_read(self):
        with self.assertRaisesRegex(hpzlab.HpzlabError, "no DeepSpeed config"):
            hpzlab.preflight(object(), versions=v("0.13.4"))
        with self.assertRaisesRegex(ValueError, "action"):
            hpzlab.preflight(FakeEngine(racy_hpz8(), TINY), action="ignore")


class Args:
    """The TrainingArguments preflight's callback reads."""

    def __init__(self, ds_config, world_size):
        self.hf_deepspeed_config = type("HfConfig", (), {"config": ds_config})()
        self.deepspeed = "ds_config.json"
        self.world_size = world_size


class State:
    is_world_process_zero = True


class TestTrainerCallback(unittest.TestCase):
    def test_callback_without_transformers(self):
        self.assertNotIn("transformers", sys.modules)
        callback = hpzlab.HpzlabPreflightCallback(gpus_per_node=8, versions=v("0.13.4"))
        # Every other event the Trainer calls is answered, doing nothing.
        self.assertIsNone(callback.on_init_end(None, State(), None))
        self.assertIsNone(callback.on_step_end(None, State(), None, model=None))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            callback.on_train_begin(Args(racy_hpz8(), 16), State(), None,
                                    model=FakeModel(TINY), tokenizer=None)
        self.assertFalse(callback.result.clean)
        self.assertEqual(len([w for w in caught if w.category is hpzlab.HpzlabWarning]), 1)
        self.assertIn("--hf-trainer", callback.result.argv)
        raising = hpzlab.HpzlabPreflightCallback(action="raise", gpus_per_node=8,
                                                 versions=v("0.13.4"))
        with self.assertRaises(hpzlab.HpzlabPreflightError):
            raising.on_train_begin(Args(racy_hpz8(), 16), State(), None, model=FakeModel(TINY))

    def test_callback_subclasses_trainer_callback_when_transformers_is_there(self):
        # A stand-in transformers with TrainerCallback, in a fresh interpreter.
        code = ("import sys, types; t = types.ModuleType('transformers'); "
                "t.TrainerCallback = type('TrainerCallback', (), {}); "
                "sys.modules['transformers'] = t; import hpzlab; "
                "assert issubclass(hpzlab.HpzlabPreflightCallback, t.TrainerCallback); "
                "assert hpzlab.HpzlabPreflightCallback is hpzlab.HpzlabPreflightCallback")
        subprocess.run([sys.executable, "-c", code], check=True)


if __name__ == "__main__":
    unittest.main()
