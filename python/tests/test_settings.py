"""Settings.from_env: the worker's RSTAR2_* variables read once, each default in one place, a malformed value named.
Run: python -m pytest tests/test_settings.py (from python/)."""
import dataclasses
import unittest

from rstar2_worker.settings import BY_DEVICE, Settings


class SettingsTest(unittest.TestCase):
    def test_an_empty_environment_gives_every_default(self):
        s = Settings.from_env({})
        self.assertEqual(s, Settings())
        self.assertEqual((s.threads, s.precision, s.model_backend, s.compile, s.sharding), (2, "fp32", "native", "auto", "ddp"))
        self.assertEqual((s.kv_tokens, s.kv_fraction, s.kv_mib, s.kv_block, s.prefix_cache), (0, 0.5, 128, 16, True))
        self.assertEqual((s.dist_timeout_s, s.dist_join_timeout_s, s.engine, s.weight_sync_dtype), (600, 45, None, None))
        self.assertEqual(Settings.from_env({"RSTAR2_MAX_BATCH": "", "RSTAR2_PRECISION": ""}), s, "empty is unset")

    def test_by_device_defaults_are_filled_in_for_a_gpu_or_a_cpu(self):
        s = Settings()
        self.assertEqual({k: getattr(s, k) for k in BY_DEVICE}, dict.fromkeys(BY_DEVICE))
        gpu, cpu = s.on_device(True), s.on_device(False)
        self.assertEqual((gpu.max_batch, gpu.prefill_tokens, gpu.cuda_graphs, gpu.kv_release), (256, 8192, "1", True))
        self.assertEqual((cpu.max_batch, cpu.prefill_tokens, cpu.cuda_graphs, cpu.kv_release), (64, 2048, "0", False))
        mine = Settings.from_env({"RSTAR2_MAX_BATCH": "8", "RSTAR2_KV_RELEASE": "1"}).on_device(False)
        self.assertEqual((mine.max_batch, mine.kv_release, mine.prefill_tokens), (8, True, 2048), "a value set wins")

    def test_values_are_parsed(self):
        s = Settings.from_env({
            "RSTAR2_THREADS": "4", "RSTAR2_PRECISION": "bf16-mixed", "RSTAR2_COMPILE": "0", "RSTAR2_SHARDING": "fsdp",
            "RSTAR2_OFFLOAD_OPTIMIZER": "1", "RSTAR2_ENGINE": "1/3", "RSTAR2_KV_FRACTION": "0.25",
            "RSTAR2_KV_TOKENS": "4096", "RSTAR2_PREFIX_CACHE": "0", "RSTAR2_CUDA_GRAPHS": "eager",
            "RSTAR2_WEIGHT_SYNC_DTYPE": "bfloat16", "RSTAR2_WORKER_FAIL": "train_step:1", "RSTAR2_WORKER_FAKE_VERSION": "0",
            "RSTAR2_DIST_JOIN_TIMEOUT_S": "10", "UNRELATED": "x",
        })
        self.assertEqual(s, dataclasses.replace(
            Settings(), threads=4, precision="bf16-mixed", compile="off", sharding="fsdp", offload_optimizer=True,
            engine=(1, 3), kv_fraction=0.25, kv_tokens=4096, prefix_cache=False, cuda_graphs="eager",
            weight_sync_dtype="bfloat16", worker_fail="train_step:1", fake_version=0, dist_join_timeout_s=10))
        for v, want in (("1", "auto"), ("auto", "auto"), ("on", "on"), ("off", "off")):
            self.assertEqual(Settings.from_env({"RSTAR2_COMPILE": v}).compile, want, v)

    def test_a_malformed_value_is_named(self):
        for env, msg in [
            ({"RSTAR2_MAX_BATCH": "abc"}, "RSTAR2_MAX_BATCH='abc' is not an integer"),
            ({"RSTAR2_KV_BLOCK": "0"}, "RSTAR2_KV_BLOCK='0' must be at least 1"),
            ({"RSTAR2_KV_FRACTION": "half"}, "RSTAR2_KV_FRACTION='half' is not a number"),
            ({"RSTAR2_KV_FRACTION": "2"}, r"RSTAR2_KV_FRACTION='2' must be in \(0, 1\]"),
            ({"RSTAR2_PREFIX_CACHE": "yes"}, "RSTAR2_PREFIX_CACHE='yes' must be 0 or 1"),
            ({"RSTAR2_COMPILE": "yes"}, "RSTAR2_COMPILE must be one of auto, on, off, got 'yes'"),
            ({"RSTAR2_SHARDING": "zero"}, "RSTAR2_SHARDING must be one of ddp, fsdp, got 'zero'"),
            ({"RSTAR2_WEIGHT_SYNC_DTYPE": "fp8"}, "RSTAR2_WEIGHT_SYNC_DTYPE must be one of bfloat16, float16, float32, got 'fp8'"),
            ({"RSTAR2_ENGINE": "x"}, "RSTAR2_ENGINE='x' must be i/n"),
            ({"RSTAR2_ENGINE": "4/4"}, r"RSTAR2_ENGINE='4/4': i must be in \[0, n\)"),
            ({"RSTAR2_OFFLOAD_OPTIMIZER": "1"}, "optimizer offload needs sharding: fsdp"),
        ]:
            with self.assertRaisesRegex(ValueError, msg):
                Settings.from_env(env)

    def test_settings_are_frozen(self):
        with self.assertRaises(dataclasses.FrozenInstanceError):
            Settings().threads = 3


if __name__ == "__main__":
    unittest.main()
