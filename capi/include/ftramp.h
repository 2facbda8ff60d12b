/*
 * ftramp.h — the C API of the ftramp runtime: Linux-style ftrace_ops in a
 * user-space process.
 *
 * Link with libftramp.a (plus -lpthread -ldl -lm -lrt -lutil -lgcc_s) or
 * with libftramp.so.  The functions to trace must have patch sites: compile
 * them with the arch's site flags (`ftramp cflags`, e.g.
 * -fpatchable-function-entry=5 on x86_64, =2 on aarch64).
 *
 *     static void count(unsigned long ip, unsigned long parent_ip,
 *                       struct ftrace_ops *op, struct ftrace_regs *fregs)
 *     {
 *         __atomic_fetch_add((long *)ftramp_ops_private(op), 1, __ATOMIC_RELAXED);
 *     }
 *
 *     long calls;
 *     struct ftrace_ops *op = ftramp_ops_new(count, 0, &calls);
 *     if (ftramp_ops_add_filter(op, "my_func*") ||
 *         ftramp_register_ftrace_function(op))
 *         fprintf(stderr, "%s\n", ftramp_last_error());
 *     ...
 *     ftramp_unregister_ftrace_function(op);
 *     ftramp_ops_free(op);
 *
 * Errors: functions returning int give 0 on success or a negative errno
 * value, and leave a message naming the bad input for ftramp_last_error():
 *   -EINVAL   a NULL pointer, text that is not UTF-8, a bad filter item,
 *             unknown flag bits, or a pointer that is no live ops
 *   -EBUSY    already registered; a second IPMODIFY ops on a site; the ops
 *             is registered (or its unregistering is still waiting for a
 *             thread to leave the callback) — filters and free are refused
 *   -ENOENT   unregistering an ops that is not registered; no such site
 *   -ESRCH    the ops' filter matches no patchable site
 *   -EDEADLK  called from inside a callback (only the ops and ftrace_regs
 *             accessors may be used there)
 *   -EIO      the runtime failed (patching, memory); see the message
 * No function panics or aborts on bad input.
 *
 * Threads: every function may be called from any thread.  Registering,
 * unregistering and freeing are serialized internally.  None is
 * async-signal-safe: a signal handler that calls one while its thread is
 * inside another (holding the runtime's lock) deadlocks.
 */
#ifndef FTRAMP_H
#define FTRAMP_H

#ifdef __cplusplus
extern "C" {
#endif

/* An ops (the runtime's `Ops`).  Opaque: allocate with ftramp_ops_new. */
struct ftrace_ops;

/* The saved registers a callback receives.  Opaque: its layout is the
 * runtime's (per arch); use the ftrace_regs_* functions below.  Valid only
 * during the callback that received it. */
struct ftrace_regs;

/* The callback, as Linux's ftrace_func_t: `ip` is the traced function's
 * patch site, `parent_ip` the address it will return to, `op` the handle
 * ftramp_ops_new returned. */
typedef void (*ftramp_func_t)(unsigned long ip, unsigned long parent_ip,
                              struct ftrace_ops *op, struct ftrace_regs *fregs);

/* ftramp_ops_new flags (Linux FTRACE_OPS_FL_*). */
/* The callback sees every register (ftrace_regs_get_register): the sites
 * it traces use the `regs` trampolines instead of the cheaper `args` ones. */
#define FTRAMP_OPS_FL_SAVE_REGS (1u << 0)
/* A traced function called from inside the callback, on the same thread,
 * does not call it again; such calls are counted
 * (ftramp_ops_recursion_misses). */
#define FTRAMP_OPS_FL_RECURSION (1u << 1)
/* The callback may redirect the traced function
 * (ftrace_regs_set_instruction_pointer).  At most one per site. */
#define FTRAMP_OPS_FL_IPMODIFY (1u << 2)

/* ftramp_site_dispatch results: what a site calls now. */
#define FTRAMP_SITE_NOP 0          /* nothing: its NOPs */
#define FTRAMP_SITE_DIRECT_ARGS 1  /* one ops' own trampoline */
#define FTRAMP_SITE_DIRECT_REGS 2  /* ... saving every register */
#define FTRAMP_SITE_LIST_ARGS 3    /* several ops: the list function */
#define FTRAMP_SITE_LIST_REGS 4    /* ... saving every register */

/* ---- Ops ---------------------------------------------------------------- */

/* A new unregistered ops calling `func` for every traced function (narrow it
 * with filters).  `flags`: FTRAMP_OPS_FL_*.  `private_data` is returned by
 * ftramp_ops_private.  NULL on error (func NULL, unknown flags). */
struct ftrace_ops *ftramp_ops_new(ftramp_func_t func, unsigned int flags, void *private_data);

/* Adds one item to the ops' filter (set_ftrace_filter) or notrace set
 * (set_ftrace_notrace), parsed as Linux's filter files: "0x..." is an
 * address (a site or its function), text with * ? [ a glob, anything else
 * a symbol name.  An empty filter traces every function; notrace removes
 * functions from it.  Only while the ops is not registered (-EBUSY). */
int ftramp_ops_add_filter(struct ftrace_ops *ops, const char *item);
int ftramp_ops_add_notrace(struct ftrace_ops *ops, const char *item);

/* Starts tracing: every matching site calls the ops (-ESRCH if none does).
 * Sites loaded later with dlopen are traced after ftramp_refresh(). */
int ftramp_register_ftrace_function(struct ftrace_ops *ops);

/* Stops tracing.  When it returns 0 the callback is never entered again
 * and no thread is inside it, so its data may be freed. */
int ftramp_unregister_ftrace_function(struct ftrace_ops *ops);

/* Frees an ops: 0, or -EBUSY while it is registered (or its unregistering
 * could not yet confirm that every thread left the callback; retry later).
 * NULL is a no-op. */
int ftramp_ops_free(struct ftrace_ops *ops);

/* The private_data given to ftramp_ops_new.  Lock-free: for callbacks. */
void *ftramp_ops_private(const struct ftrace_ops *ops);

/* Calls the FTRAMP_OPS_FL_RECURSION guard refused.  Lock-free.  Adding a
 * filter item resets it. */
unsigned long ftramp_ops_recursion_misses(const struct ftrace_ops *ops);

/* ---- The process -------------------------------------------------------- */

/* Re-reads the loaded modules after dlopen/dlclose and applies every
 * registered ops to them (sites of unloaded modules are dropped untouched). */
int ftramp_refresh(void);

/* What the site at `addr` (a site, or the function it is in) calls now:
 * FTRAMP_SITE_*; -ENOENT if no known site (sites are known after the first
 * register or refresh). */
int ftramp_site_dispatch(unsigned long addr);

/* The message of this thread's last failed call ("" if none).  Valid until
 * the thread's next failing call. */
const char *ftramp_last_error(void);

/* The host arch's spec name ("x86_64", "aarch64", ...). */
const char *ftramp_arch(void);

/* Integer / FP argument registers saved in struct ftrace_regs. */
unsigned int ftramp_nr_int_args(void);
unsigned int ftramp_nr_fp_args(void);

/* ---- struct ftrace_regs (inside a callback) ----------------------------- */
/* A NULL fregs reads 0 and writes nothing. */

/* The n-th integer argument register; 0 past ftramp_nr_int_args(). */
unsigned long ftrace_regs_get_argument(const struct ftrace_regs *fregs, unsigned int n);
/* 0, or -EINVAL past the last argument register.  s390x: argument 4 is r6,
   which callees preserve, so setting it changes the caller's r6 after the
   call too. */
int ftrace_regs_set_argument(struct ftrace_regs *fregs, unsigned int n, unsigned long v);
/* The n-th FP argument register as a double; 0.0 past ftramp_nr_fp_args(). */
double ftrace_regs_get_fp_argument(const struct ftrace_regs *fregs, unsigned int n);

/* The return registers (meaningful where a function returns). */
unsigned long ftrace_regs_get_return_value(const struct ftrace_regs *fregs);
void ftrace_regs_set_return_value(struct ftrace_regs *fregs, unsigned long v);
double ftrace_regs_get_fp_return_value(const struct ftrace_regs *fregs);
int ftrace_regs_set_fp_return_value(struct ftrace_regs *fregs, double v);

/* Where execution resumes after the callback (the instruction after the
 * patch site); an IPMODIFY ops redirects the function by setting it, e.g.
 * to another function's address. */
unsigned long ftrace_regs_get_instruction_pointer(const struct ftrace_regs *fregs);
void ftrace_regs_set_instruction_pointer(struct ftrace_regs *fregs, unsigned long ip);

/* The traced function's stack pointer at its entry, and frame pointer. */
unsigned long ftrace_regs_get_stack_pointer(const struct ftrace_regs *fregs);
unsigned long ftrace_regs_get_frame_pointer(const struct ftrace_regs *fregs);

/* Where the traced function will return (parent_ip); may be changed. */
unsigned long ftrace_regs_get_return_address(const struct ftrace_regs *fregs);
void ftrace_regs_set_return_address(struct ftrace_regs *fregs, unsigned long ra);

/* Any saved register by its spec name ("rbx", "x19", ...) into *value: 0,
 * or -EINVAL for an unknown name.  Registers outside struct ftrace_regs are
 * meaningful only in callbacks of FTRAMP_OPS_FL_SAVE_REGS ops. */
int ftrace_regs_get_register(const struct ftrace_regs *fregs, const char *name, unsigned long *value);

#ifdef __cplusplus
}
#endif

#endif /* FTRAMP_H */
