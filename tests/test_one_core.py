"""One fp8kit core per process.

The core is one shared library, libfp8kit.so, shipped beside the two
extension modules, which link it instead of holding copies of its code. A
process that imports fp8kit.torch and fp8kit.jax so has one GEMM plan cache,
one device capability cache and one CUDA runtime linkage (inside the core).
Checked on the files the imports really loaded: what the process has
mapped, where the C API resolves from each module, and each file's dynamic
section and symbol table (read by the small ELF reader below).
"""
import ctypes
import os
import struct

import fp8kit.jax  # noqa: F401  (loads fp8kit._jax_ext)
import fp8kit.torch  # noqa: F401  (loads fp8kit._torch_ext)
from fp8kit import _jax_ext, _torch_ext

CORE = "libfp8kit.so"
EXTENSIONS = {"_torch_ext": _torch_ext, "_jax_ext": _jax_ext}


def _mapped_cores():
    """Distinct files named libfp8kit.so that this process has mapped."""
    with open("/proc/self/maps") as f:
        fields = [line.split(None, 5) for line in f]
    paths = {parts[5].strip() for parts in fields if len(parts) == 6}
    return sorted(p for p in paths if os.path.basename(p) == CORE)


def _the_core():
    cores = _mapped_cores()
    assert len(cores) == 1, "expected one %s in this process, found %s" % (CORE, cores)
    return cores[0]


def _address(library, symbol):
    return ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value


# ------------------------------------------------------------- ELF reader ---

_SHT_DYNAMIC, _SHT_DYNSYM = 6, 11
_DT_NEEDED = 1
_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10


def _read_elf(path):
    """(DT_NEEDED names, names of the symbols the file defines and exports)
    of a 64-bit little-endian ELF shared object."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, path + ": not ELF64 LE"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(table, offset):
        start = sections[table][4] + offset
        return data[start:data.index(b"\0", start)].decode()

    needed, defined = [], []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind == _SHT_DYNAMIC:
            for at in range(offset, offset + size, entsize):
                tag, value = struct.unpack_from("<qQ", data, at)
                if tag == _DT_NEEDED:
                    needed.append(string(link, value))
        elif kind == _SHT_DYNSYM:
            for at in range(offset + entsize, offset + size, entsize):  # entry 0 is null
                name, info, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", data, at)
                if shndx != 0 and info >> 4 in (_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE):
                    defined.append(string(link, name))
    return needed, defined


# ------------------------------------------------------------------ tests ---

def test_one_core_is_mapped_beside_the_extensions():
    core = _the_core()
    for name, module in EXTENSIONS.items():
        here = os.path.dirname(os.path.realpath(module.__file__))
        assert os.path.dirname(core) == here, "%s is not beside %s" % (core, name)


def test_the_c_api_resolves_to_one_address_from_both_extensions():
    # dlsym through each module's handle: the module itself, then what it links.
    found = {name: _address(ctypes.CDLL(module.__file__), "fp8kit_version")
             for name, module in EXTENSIONS.items()}
    assert len(set(found.values())) == 1, "fp8kit_version differs between modules: %s" % found
    assert set(found.values()) == {_address(ctypes.CDLL(_the_core()), "fp8kit_version")}


def test_the_extensions_link_the_core_and_no_cuda_runtime():
    for name, module in EXTENSIONS.items():
        needed, defined = _read_elf(module.__file__)
        assert CORE in needed, "%s does not link %s: %s" % (name, CORE, needed)
        assert not [n for n in needed if n.startswith("libcudart")], (name, needed)
        own = [s for s in defined if s.startswith("fp8kit_")]
        assert not own, "%s defines core symbols of its own: %s" % (name, own)


def test_the_core_exports_its_c_api_only():
    needed, defined = _read_elf(_the_core())
    assert "fp8kit_version" in defined and "fp8kit_gemm" in defined, defined
    assert [s for s in defined if not s.startswith("fp8kit_")] == []
    # The CUDA runtime (CUDA builds) is linked in statically, not as a library.
    assert not [n for n in needed if n.startswith("libcudart")], needed
