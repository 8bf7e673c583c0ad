"""The arm64 cross-build sysroot of provision.ensure_cross_sysroot (used by
scripts/llama_cpp_check.sh): absolute symlinks are pointed inside the root."""
import os

from tilegen.emulate.provision import _relativize_symlinks


def test_absolute_symlinks_stay_inside_the_root(tmp_path):
    lib = tmp_path / "lib" / "aarch64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libm.so.6").write_text("elf")
    dev = tmp_path / "usr" / "lib" / "aarch64-linux-gnu"
    dev.mkdir(parents=True)
    os.symlink("/lib/aarch64-linux-gnu/libm.so.6", dev / "libm.so")
    os.symlink("libm.so", dev / "libm-rel.so")          # relative: left alone
    os.symlink("/lib", tmp_path / "lib64")               # a directory link
    _relativize_symlinks(tmp_path)
    assert os.readlink(dev / "libm.so") == "../../../lib/aarch64-linux-gnu/libm.so.6"
    assert (dev / "libm.so").read_text() == "elf"
    assert os.readlink(dev / "libm-rel.so") == "libm.so"
    assert os.readlink(tmp_path / "lib64") == "lib"
