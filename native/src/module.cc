// The Python module jaxmnist_onednn._handlers: each XLA FFI handler of
// onednn_conv.cc as a PyCapsule, named by the target jaxmnist registers it
// under (jax.ffi.register_ffi_target takes the capsule), and the version of
// the oneDNN library this process loaded.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "oneapi/dnnl/dnnl.h"
#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmnistOnednnConvForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmnistOnednnConvBackwardData);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmnistOnednnConvBackwardWeights);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmnistOnednnPoolForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmnistOnednnPoolBiasRelu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmnistOnednnPoolBiasReluForward);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxmnistOnednnPoolBackward);

namespace {

struct Target {
  const char* name;
  XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*);
};

const Target kTargets[] = {
    {"jaxmnist_onednn_conv_forward", JaxmnistOnednnConvForward},
    {"jaxmnist_onednn_conv_backward_data", JaxmnistOnednnConvBackwardData},
    {"jaxmnist_onednn_conv_backward_weights", JaxmnistOnednnConvBackwardWeights},
    {"jaxmnist_onednn_pool_forward", JaxmnistOnednnPoolForward},
    {"jaxmnist_onednn_pool_bias_relu", JaxmnistOnednnPoolBiasRelu},
    {"jaxmnist_onednn_pool_bias_relu_forward", JaxmnistOnednnPoolBiasReluForward},
    {"jaxmnist_onednn_pool_backward", JaxmnistOnednnPoolBackward},
};

PyObject* Handlers(PyObject*, PyObject*) {
  PyObject* handlers = PyDict_New();
  if (handlers == nullptr) return nullptr;
  for (const Target& target : kTargets) {
    PyObject* capsule = PyCapsule_New(reinterpret_cast<void*>(target.handler), nullptr, nullptr);
    int failed = capsule == nullptr || PyDict_SetItemString(handlers, target.name, capsule) < 0;
    Py_XDECREF(capsule);
    if (failed) {
      Py_DECREF(handlers);
      return nullptr;
    }
  }
  return handlers;
}

PyObject* OnednnVersion(PyObject*, PyObject*) {
  const dnnl_version_t* version = dnnl_version();
  return Py_BuildValue("(iii)", version->major, version->minor, version->patch);
}

PyMethodDef kMethods[] = {
    {"handlers", Handlers, METH_NOARGS,
     "handlers() -> dict: FFI target name -> PyCapsule of its XLA FFI handler (CPU)."},
    {"onednn_version", OnednnVersion, METH_NOARGS,
     "onednn_version() -> (major, minor, patch) of the oneDNN library loaded."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_handlers", "oneDNN's convolution and pooling as XLA FFI handlers.",
    0, kMethods,
};

}  // namespace

PyMODINIT_FUNC PyInit__handlers() { return PyModule_Create(&kModule); }
