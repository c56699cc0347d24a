# File: conanfile.py — the Conan 2 recipe for pdcoll (header-only).
#
#     conan profile detect                              # once per machine
#     conan create . -s compiler.cppstd=20              # or scripts/conan-check.sh
#
# pdcoll has no Conan requirements: libfabric, liburing and threads are taken
# from the system (Debian: libfabric-dev, liburing-dev; see
# scripts/install-deps.sh), so creating the package needs no Conan remote —
# the build machines reach none. Consumers get the CMake target
# pdcoll::pdcoll (CMakeDeps) and the pkg-config name pdcoll (PkgConfigDeps).
# With -o "pdcoll/*:with_pmix=True" they also get PMIx from the system
# (pkg-config `pmix`; Debian: libpmix-dev) and PDCOLL_WITH_PMIX, so mpirun
# needs no PDCOLL_ROOT (include/pdcoll/bootstrap/pmix.hpp).
import os
import re

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
from conan.tools.gnu import PkgConfig
from conan.tools.layout import basic_layout


class PdcollConan(ConanFile):
    name = "pdcoll"
    description = ("Header-only C++20 collective communication with sender/receiver "
                   "APIs over libfabric and io_uring")
    topics = ("collectives", "all-reduce", "libfabric", "io_uring", "senders", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_pmix": [True, False]}
    default_options = {"with_pmix": False}
    exports_sources = "include/*", "tools/*", "cmake/*", "CMakeLists.txt", "README.md"
    no_copy_source = True

    def set_version(self):
        # One source of truth: project(pdcoll VERSION x.y.z) in CMakeLists.txt.
        text = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        self.version = re.search(r"project\(pdcoll\s+VERSION\s+([0-9.]+)", text).group(1)

    def layout(self):
        basic_layout(self, src_folder=".")

    def validate(self):
        # Concepts, coroutines and designated initialisers throughout.
        check_min_cppstd(self, 20)
        if self.settings.os != "Linux":
            from conan.errors import ConanInvalidConfiguration
            raise ConanInvalidConfiguration("pdcoll needs Linux (libfabric, io_uring, memfd, DMA-BUF)")

    def package_id(self):
        # Header-only: one package for every configuration (with_pmix only
        # changes what package_info tells the consumer).
        self.info.clear()

    def package(self):
        copy(self, "*.hpp", src=os.path.join(self.source_folder, "include"),
             dst=os.path.join(self.package_folder, "include"))
        copy(self, "pdcoll-run", src=os.path.join(self.source_folder, "tools"),
             dst=os.path.join(self.package_folder, "bin"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "pdcoll")
        self.cpp_info.set_property("cmake_target_name", "pdcoll::pdcoll")
        self.cpp_info.set_property("pkg_config_name", "pdcoll")
        self.cpp_info.libdirs = []
        # bin/pdcoll-run, the local launcher; on PATH in the "conanrun" environment.
        self.cpp_info.bindirs = ["bin"]
        # From the system, not from Conan (see the banner).
        self.cpp_info.system_libs = ["fabric", "uring", "pthread"]
        if self.options.with_pmix:
            # Found where the package is used, as libfabric and liburing are.
            pmix = PkgConfig(self, "pmix")
            self.cpp_info.includedirs = ["include"] + pmix.includedirs
            self.cpp_info.libdirs = pmix.libdirs
            self.cpp_info.system_libs += pmix.libs
            self.cpp_info.defines = ["PDCOLL_WITH_PMIX"]
