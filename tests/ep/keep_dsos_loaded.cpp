// Sanitizer builds only: dlclose does nothing, so Open MPI's components (dlopen'ed plugins,
// unloaded in MPI_Finalize) stay mapped until exit and LeakSanitizer can name the library
// of their lifelong allocations, which tests/ep/lsan.supp then suppresses. Without it those
// frames read "<unknown module>" and no suppression can match them.
extern "C" int dlclose(void*) { return 0; }
