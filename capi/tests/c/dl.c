/* A shared library the C API test loads with dlopen (patch-site flags). */
long capi_dl_func(long a) { return a + 7; }
