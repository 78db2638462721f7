// Python's own memory from glibc's heap instead of fresh mappings (runtime/allocator.py installs it).
//
// CPython takes two kinds of block from its "arena allocator", by default a new mmap each time and a munmap when
// given back: the small-object allocator's arenas (1 MiB) and the frame stack's chunks (16 KiB, 3.11 and later).
// Where a loop keeps calling at the depth where one chunk ends, every call maps a chunk, faults its pages in and
// unmaps it (CPython gh-142183, fixed only in 3.13 and later by keeping one chunk): the server's start met it in
// numpy's typing modules, 3,300 mmap/munmap pairs and as many page faults, 60-100 ms of a 0.4 s start. From glibc's
// heap (its mmap threshold raised to 32 MiB by tune_allocator) a block given back is reused by the next one.
//
// Blocks taken before the allocator was installed are still given back to the allocator that mapped them: the set
// of blocks this one gave tells them apart. Arenas and chunks are taken and given back with the GIL held, except
// where a thread state is deleted without it, hence the mutex.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_set>

namespace {

struct HeapArenas {
  std::mutex lock;
  std::unordered_set<void*> given;
  PyObjectArenaAllocator before{};
};

HeapArenas* installed = nullptr;  // never freed: arenas are given back until the interpreter's very end

void* TakeBlock(void*, size_t size) {
  void* block = std::malloc(size);
  if (block == nullptr) return nullptr;
  try {
    std::lock_guard<std::mutex> held(installed->lock);
    installed->given.insert(block);
  } catch (...) {  // no memory for the set's node: the block is not handed out
    std::free(block);
    return nullptr;
  }
  return block;
}

void GiveBack(void*, void* block, size_t size) {
  if (block == nullptr) return;
  {
    std::lock_guard<std::mutex> held(installed->lock);
    if (installed->given.erase(block) == 1) {
      std::free(block);
      return;
    }
  }
  installed->before.free(installed->before.ctx, block, size);  // mapped before this allocator was installed
}

PyObject* Install(PyObject*, PyObject*) {
  if (installed == nullptr) {
    installed = new (std::nothrow) HeapArenas();
    if (installed == nullptr) return PyErr_NoMemory();
    PyObject_GetArenaAllocator(&installed->before);
    PyObjectArenaAllocator heap{nullptr, TakeBlock, GiveBack};
    PyObject_SetArenaAllocator(&heap);
  }
  Py_RETURN_NONE;
}

PyObject* HeapBlocks(PyObject*, PyObject*) {
  if (installed == nullptr) return PyLong_FromLong(-1);
  std::lock_guard<std::mutex> held(installed->lock);
  return PyLong_FromSize_t(installed->given.size());
}

PyMethodDef methods[] = {
    {"install", Install, METH_NOARGS,
     "From now on Python's arenas and frame-stack chunks come from malloc (once per process; again: nothing)."},
    {"heap_blocks", HeapBlocks, METH_NOARGS,
     "How many blocks the heap allocator holds given out now (-1: not installed)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "_python_arenas",
    "Python's arenas and frame-stack chunks from glibc's heap (runtime/python_arenas.cc).", -1, methods,
    nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__python_arenas() { return PyModule_Create(&module_definition); }
