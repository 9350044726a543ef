"""The persistent compilation cache: on by default, its folder configurable, and left off
(never an error) where the folder cannot be made."""

import jax
import pytest

from training.compilation import enable_compilation_cache

KEYS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes")


@pytest.fixture
def restore_jax_config():
    saved = {key: getattr(jax.config, key) for key in KEYS}
    yield
    for key, value in saved.items():
        jax.config.update(key, value)


def test_the_cache_keeps_every_program_in_the_configured_folder(tmp_path, monkeypatch,
                                                                restore_jax_config):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "xla"))
    enable_compilation_cache()
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
    assert (tmp_path / "xla").is_dir()
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0


def test_a_folder_that_cannot_be_made_leaves_the_cache_as_it_was(tmp_path, monkeypatch,
                                                                 restore_jax_config):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "a_file" / "xla"))
    before = jax.config.jax_compilation_cache_dir
    enable_compilation_cache()  # no exception
    assert jax.config.jax_compilation_cache_dir == before
