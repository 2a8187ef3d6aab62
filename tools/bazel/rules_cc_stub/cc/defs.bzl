"""Offline stand-in for @rules_cc//cc:defs.bzl.

Bazel 4.2.3's own @bazel_tools loads its C++ rules from @rules_cc, which
Bazel would otherwise download (Debian's bazel-rules-cc is too new for
4.2.3). The real file only forwards to the native rules, so we do too.
lingvo_pipe has no C++; nothing here is built by `bazel test //...`.
"""

def cc_binary(**attrs):
    native.cc_binary(**attrs)

def cc_import(**attrs):
    native.cc_import(**attrs)

def cc_library(**attrs):
    native.cc_library(**attrs)

def cc_proto_library(**attrs):
    native.cc_proto_library(**attrs)

def cc_test(**attrs):
    native.cc_test(**attrs)

def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)

def fdo_prefetch_hints(**attrs):
    native.fdo_prefetch_hints(**attrs)

def fdo_profile(**attrs):
    native.fdo_profile(**attrs)

def objc_import(**attrs):
    native.objc_import(**attrs)

def objc_library(**attrs):
    native.objc_library(**attrs)
