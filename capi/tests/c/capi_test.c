/* The C API end to end, from C: run by capi/tests/c_api.rs, linked once
 * against libftramp.a and once against libftramp.so.
 *
 *   capi_test <path of the dlopen test library>
 *
 * Prints one line per failed check and "N passed, M failed"; exits non-zero
 * if any check failed.  Compiled without patch-site flags: only tracee.c
 * and dl.c have sites. */
#include "ftramp.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

long capi_tracee_add(long a, long b);
long capi_tracee_six(long a, long b, long c, long d, long e, long f);
long capi_tracee_other(long a);
long capi_tracee_redirected(long a, long b);
long capi_alt(long a, long b);
double capi_tracee_fp(double x, double y);
long capi_tracee_recurse(long a);

static int passed, failed;

/* A function without a patch site (this file has no site flags). */
__attribute__((noinline)) long capi_no_site(long a) { return a ^ 1; }

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (cond) {                                                            \
            passed++;                                                          \
        } else {                                                               \
            failed++;                                                          \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);             \
            printf(__VA_ARGS__);                                               \
            printf(" [last error: %s]\n", ftramp_last_error());                \
        }                                                                      \
    } while (0)

#define ADDR(f) ((unsigned long)(f))

/* What a callback saw, found through ftramp_ops_private. */
struct seen {
    long calls;
    struct ftrace_ops *op;
    unsigned long ip, parent_ip, resume, return_address, sp;
    unsigned long args[6];
    double fp[2];
    int nested; /* result of a register call made inside the callback */
};

static void record(unsigned long ip, unsigned long parent_ip, struct ftrace_ops *op, struct ftrace_regs *fregs)
{
    struct seen *s = ftramp_ops_private(op);
    s->calls++;
    s->op = op;
    s->ip = ip;
    s->parent_ip = parent_ip;
    s->resume = ftrace_regs_get_instruction_pointer(fregs);
    s->return_address = ftrace_regs_get_return_address(fregs);
    s->sp = ftrace_regs_get_stack_pointer(fregs);
    for (int i = 0; i < 6; i++)
        s->args[i] = ftrace_regs_get_argument(fregs, i);
    s->fp[0] = ftrace_regs_get_fp_argument(fregs, 0);
    s->fp[1] = ftrace_regs_get_fp_argument(fregs, 1);
}

/* Only counts (safe from several threads). */
static void count(unsigned long ip, unsigned long parent_ip, struct ftrace_ops *op, struct ftrace_regs *fregs)
{
    (void)ip, (void)parent_ip, (void)fregs;
    struct seen *s = ftramp_ops_private(op);
    __atomic_fetch_add(&s->calls, 1, __ATOMIC_RELAXED);
}

static struct ftrace_ops *new_ops(ftramp_func_t f, unsigned int flags, struct seen *s, const char *filter)
{
    memset(s, 0, sizeof(*s));
    struct ftrace_ops *op = ftramp_ops_new(f, flags, s);
    CHECK(op != NULL, "ftramp_ops_new");
    if (filter)
        CHECK(ftramp_ops_add_filter(op, filter) == 0, "filter %s", filter);
    return op;
}

static void test_errors(void)
{
    struct seen s;
    CHECK(strlen(ftramp_arch()) > 0, "arch");
    CHECK(ftramp_nr_int_args() >= 6, "%u int args", ftramp_nr_int_args());
    CHECK(ftramp_nr_fp_args() >= 2, "%u fp args", ftramp_nr_fp_args());

    CHECK(ftramp_ops_new(NULL, 0, NULL) == NULL, "NULL func refused");
    CHECK(strstr(ftramp_last_error(), "func is NULL") != NULL, "message: %s", ftramp_last_error());
    CHECK(ftramp_ops_new(count, 1u << 7, NULL) == NULL, "unknown flag refused");
    CHECK(strstr(ftramp_last_error(), "0x80") != NULL, "message: %s", ftramp_last_error());

    struct ftrace_ops *op = new_ops(count, 0, &s, NULL);
    CHECK(ftramp_ops_add_filter(NULL, "x") == -EINVAL, "NULL ops");
    CHECK(ftramp_ops_add_filter(op, NULL) == -EINVAL, "NULL item");
    CHECK(ftramp_ops_add_filter(op, "bad\xff\xfe") == -EINVAL, "bad UTF-8");
    CHECK(strstr(ftramp_last_error(), "not UTF-8") != NULL, "message: %s", ftramp_last_error());
    /* An unclosed [ is a plain character (as in ftrace): a name, not a bad glob. */
    CHECK(ftramp_ops_add_filter(op, "0x") == -EINVAL, "an address without digits");
    CHECK(strstr(ftramp_last_error(), "`0x`") != NULL, "the message names the item: %s", ftramp_last_error());
    CHECK(ftramp_ops_add_notrace(op, "0xzz") == -EINVAL, "bad address");
    CHECK(strstr(ftramp_last_error(), "0xzz") != NULL, "message: %s", ftramp_last_error());
    CHECK(ftramp_ops_add_filter(op, "no_such_function_here") == 0, "a symbol");
    CHECK(ftramp_register_ftrace_function(op) == -ESRCH, "matches no site");
    CHECK(strstr(ftramp_last_error(), "no_such_function_here") != NULL, "message: %s", ftramp_last_error());
    CHECK(ftramp_unregister_ftrace_function(op) == -ENOENT, "not registered");
    int local;
    CHECK(ftramp_register_ftrace_function((struct ftrace_ops *)&local) == -EINVAL, "not an ops");
    CHECK(ftramp_ops_free((struct ftrace_ops *)&local) == -EINVAL, "free of a non-ops");
    CHECK(ftramp_ops_private(NULL) == NULL, "private of NULL");
    CHECK(ftrace_regs_get_argument(NULL, 0) == 0, "NULL fregs reads 0");
    CHECK(ftrace_regs_set_argument(NULL, 0, 1) == -EINVAL, "NULL fregs write");
    CHECK(ftramp_ops_free(op) == 0, "free");
    CHECK(ftramp_ops_free(op) == -EINVAL, "double free is refused");
    CHECK(ftramp_ops_free(NULL) == 0, "free(NULL)");
}

static void test_symbol_filter(void)
{
    struct seen s;
    struct ftrace_ops *op = new_ops(record, 0, &s, "capi_tracee_six");
    CHECK(ftramp_register_ftrace_function(op) == 0, "register");
    CHECK(ftramp_site_dispatch(ADDR(capi_tracee_six)) == FTRAMP_SITE_DIRECT_ARGS, "one ops: direct, args tier: %d",
          ftramp_site_dispatch(ADDR(capi_tracee_six)));
    CHECK(ftramp_site_dispatch(ADDR(capi_tracee_add)) == FTRAMP_SITE_NOP, "untraced: NOPs");
    CHECK(ftramp_site_dispatch(ADDR(capi_no_site)) == -ENOENT, "no site there");
    CHECK(strstr(ftramp_last_error(), "no known patch site") != NULL, "message: %s", ftramp_last_error());

    long r = 0;
    for (int i = 0; i < 10; i++)
        r += capi_tracee_six(1, 2, 3, 4, 5, 6);
    CHECK(r == 10 * 91, "results unchanged: %ld", r);
    CHECK(s.calls == 10, "exact count: %ld", s.calls);
    CHECK(s.op == op, "the callback gets its own handle");
    for (int i = 0; i < 6; i++)
        CHECK(s.args[i] == (unsigned long)i + 1, "argument %d = %lu", i, s.args[i]);
    CHECK(s.ip >= ADDR(capi_tracee_six) && s.ip < ADDR(capi_tracee_six) + 16, "ip %#lx in the function at %#lx", s.ip,
          ADDR(capi_tracee_six));
    CHECK(s.resume > s.ip && s.resume <= s.ip + 16, "resumes after the site: %#lx (site %#lx)", s.resume, s.ip);
    CHECK(s.return_address == s.parent_ip && s.parent_ip != 0, "return address %#lx = parent_ip %#lx", s.return_address,
          s.parent_ip);
    CHECK(s.sp != 0, "sp");
    capi_tracee_add(1, 2);
    CHECK(s.calls == 10, "other functions are not traced: %ld", s.calls);

    CHECK(ftramp_register_ftrace_function(op) == -EBUSY, "twice");
    CHECK(ftramp_ops_add_filter(op, "capi_tracee_add") == -EBUSY, "no filter change while registered");
    CHECK(ftramp_ops_free(op) == -EBUSY, "no free while registered");
    CHECK(ftramp_unregister_ftrace_function(op) == 0, "unregister");
    capi_tracee_six(1, 2, 3, 4, 5, 6);
    CHECK(s.calls == 10, "never called after unregister: %ld", s.calls);
    CHECK(ftramp_site_dispatch(ADDR(capi_tracee_six)) == FTRAMP_SITE_NOP, "back to NOPs");

    /* By address, and FP arguments. */
    CHECK(ftramp_ops_add_filter(op, "capi_tracee_fp") == 0, "filter again once unregistered");
    CHECK(ftramp_register_ftrace_function(op) == 0, "register again");
    s.calls = 0;
    CHECK(capi_tracee_fp(2.5, 4.0) == 11.0, "fp result");
    CHECK(s.calls == 1 && s.fp[0] == 2.5 && s.fp[1] == 4.0, "fp args %g %g (%ld calls)", s.fp[0], s.fp[1], s.calls);
    CHECK(ftramp_unregister_ftrace_function(op) == 0, "unregister");
    CHECK(ftramp_ops_free(op) == 0, "free once unregistered");

    char item[32];
    snprintf(item, sizeof item, "0x%lx", ADDR(capi_tracee_other));
    op = new_ops(count, 0, &s, item);
    CHECK(ftramp_register_ftrace_function(op) == 0, "register by address %s", item);
    capi_tracee_other(1);
    capi_tracee_add(1, 1);
    CHECK(s.calls == 1, "address filter: %ld", s.calls);
    CHECK(ftramp_unregister_ftrace_function(op) == 0 && ftramp_ops_free(op) == 0, "done");
}

static void test_glob_notrace_and_list(void)
{
    struct seen g, one;
    struct ftrace_ops *glob = new_ops(count, 0, &g, "capi_tracee_*");
    CHECK(ftramp_ops_add_notrace(glob, "capi_tracee_other") == 0, "notrace");
    CHECK(ftramp_register_ftrace_function(glob) == 0, "register glob");
    struct ftrace_ops *op = new_ops(count, 0, &one, "capi_tracee_add");
    CHECK(ftramp_register_ftrace_function(op) == 0, "register a second ops");
    CHECK(ftramp_site_dispatch(ADDR(capi_tracee_add)) == FTRAMP_SITE_LIST_ARGS, "two ops: list");
    CHECK(ftramp_site_dispatch(ADDR(capi_tracee_six)) == FTRAMP_SITE_DIRECT_ARGS, "one ops: direct");
    CHECK(ftramp_site_dispatch(ADDR(capi_tracee_other)) == FTRAMP_SITE_NOP, "notrace: NOPs");
    CHECK(ftramp_site_dispatch(ADDR(capi_alt)) == FTRAMP_SITE_NOP, "outside the glob: NOPs");
    for (int i = 0; i < 3; i++)
        capi_tracee_add(i, i);
    for (int i = 0; i < 2; i++)
        capi_tracee_six(1, 1, 1, 1, 1, 1);
    for (int i = 0; i < 5; i++)
        capi_tracee_other(i);
    capi_alt(1, 2);
    CHECK(g.calls == 5, "glob minus notrace: %ld", g.calls);
    CHECK(one.calls == 3, "symbol: %ld", one.calls);
    CHECK(ftramp_unregister_ftrace_function(op) == 0, "unregister");
    CHECK(ftramp_site_dispatch(ADDR(capi_tracee_add)) == FTRAMP_SITE_DIRECT_ARGS, "one left: direct again");
    capi_tracee_add(1, 1);
    CHECK(g.calls == 6 && one.calls == 3, "%ld %ld", g.calls, one.calls);
    CHECK(ftramp_unregister_ftrace_function(glob) == 0, "unregister glob");
    CHECK(ftramp_ops_free(op) == 0 && ftramp_ops_free(glob) == 0, "free");
}

static void save_regs_cb(unsigned long ip, unsigned long parent_ip, struct ftrace_ops *op, struct ftrace_regs *fregs)
{
    (void)ip, (void)parent_ip;
    struct seen *s = ftramp_ops_private(op);
    const char *callee_saved = strcmp(ftramp_arch(), "x86_64") == 0 ? "rbx" : "x19";
    unsigned long v = 0;
    s->calls++;
    s->nested = ftrace_regs_get_register(fregs, callee_saved, &v) == 0 &&
                ftrace_regs_get_register(fregs, "no_such_reg", &v) == -EINVAL &&
                ftrace_regs_get_register(fregs, callee_saved, NULL) == -EINVAL;
}

static void test_save_regs(void)
{
    struct seen s;
    struct ftrace_ops *op = new_ops(save_regs_cb, FTRAMP_OPS_FL_SAVE_REGS, &s, "capi_tracee_add");
    CHECK(ftramp_register_ftrace_function(op) == 0, "register");
    CHECK(ftramp_site_dispatch(ADDR(capi_tracee_add)) == FTRAMP_SITE_DIRECT_REGS, "SAVE_REGS: regs tier");
    CHECK(capi_tracee_add(20, 22) == 42, "result");
    CHECK(s.calls == 1 && s.nested == 1, "registers by name (%ld calls)", s.calls);
    CHECK(ftramp_unregister_ftrace_function(op) == 0 && ftramp_ops_free(op) == 0, "done");
}

static void redirect(unsigned long ip, unsigned long parent_ip, struct ftrace_ops *op, struct ftrace_regs *fregs)
{
    (void)ip, (void)parent_ip, (void)op;
    ftrace_regs_set_instruction_pointer(fregs, ADDR(capi_alt));
}

static void change_arg(unsigned long ip, unsigned long parent_ip, struct ftrace_ops *op, struct ftrace_regs *fregs)
{
    (void)ip, (void)parent_ip;
    struct seen *s = ftramp_ops_private(op);
    s->calls++;
    s->nested = ftrace_regs_set_argument(fregs, 0, 10) == 0 && ftrace_regs_set_argument(fregs, 1000, 1) == -EINVAL;
}

static void test_ipmodify_and_writes(void)
{
    struct seen s, t, u;
    struct ftrace_ops *op = new_ops(redirect, FTRAMP_OPS_FL_IPMODIFY, &s, "capi_tracee_redirected");
    CHECK(ftramp_register_ftrace_function(op) == 0, "register IPMODIFY");
    CHECK(capi_tracee_redirected(3, 4) == -7, "redirected to capi_alt: %ld", capi_tracee_redirected(3, 4));
    struct ftrace_ops *second = new_ops(redirect, FTRAMP_OPS_FL_IPMODIFY, &t, "capi_tracee_re*");
    CHECK(ftramp_register_ftrace_function(second) == -EBUSY, "a second IPMODIFY ops on the site is refused");
    CHECK(strstr(ftramp_last_error(), "capi_tracee_redirected") != NULL && strstr(ftramp_last_error(), "IPMODIFY") != NULL,
          "message: %s", ftramp_last_error());
    CHECK(ftramp_unregister_ftrace_function(op) == 0, "unregister");
    CHECK(capi_tracee_redirected(3, 4) == 304, "no redirect after unregister");
    CHECK(ftramp_ops_free(op) == 0 && ftramp_ops_free(second) == 0, "free");

    op = new_ops(change_arg, 0, &u, "capi_tracee_other");
    CHECK(ftramp_register_ftrace_function(op) == 0, "register");
    CHECK(capi_tracee_other(1) == 30, "argument 0 rewritten to 10: %ld", capi_tracee_other(1));
    CHECK(u.nested == 1, "set_argument results");
    CHECK(ftramp_unregister_ftrace_function(op) == 0 && ftramp_ops_free(op) == 0, "done");
}

static struct ftrace_ops *inner_op;

static void recurse_cb(unsigned long ip, unsigned long parent_ip, struct ftrace_ops *op, struct ftrace_regs *fregs)
{
    (void)ip, (void)parent_ip, (void)fregs;
    struct seen *s = ftramp_ops_private(op);
    s->calls++;
    capi_tracee_recurse(100); /* re-enters the traced function: guarded */
    s->nested = ftramp_register_ftrace_function(inner_op);
}

static void test_recursion_and_callback_limits(void)
{
    struct seen s, i;
    inner_op = new_ops(count, 0, &i, "capi_tracee_add");
    struct ftrace_ops *op = new_ops(recurse_cb, FTRAMP_OPS_FL_RECURSION, &s, "capi_tracee_recurse");
    CHECK(ftramp_register_ftrace_function(op) == 0, "register");
    CHECK(capi_tracee_recurse(1) == 2, "result");
    CHECK(capi_tracee_recurse(2) == 3, "result");
    CHECK(s.calls == 2, "the guard keeps the callback from re-entering: %ld", s.calls);
    CHECK(ftramp_ops_recursion_misses(op) == 2, "misses counted: %lu", ftramp_ops_recursion_misses(op));
    CHECK(s.nested == -EDEADLK, "register inside a callback is refused: %d", s.nested);
    CHECK(ftramp_unregister_ftrace_function(op) == 0 && ftramp_ops_free(op) == 0, "done");
    CHECK(ftramp_ops_free(inner_op) == 0, "never registered");
}

static void test_dlopen(const char *dl_path)
{
    struct seen s;
    struct ftrace_ops *op = new_ops(count, 0, &s, "capi_dl_*");
    CHECK(ftramp_register_ftrace_function(op) == -ESRCH, "not loaded yet");
    CHECK(ftramp_ops_add_filter(op, "capi_tracee_add") == 0, "and a loaded function");
    CHECK(ftramp_register_ftrace_function(op) == 0, "register");
    void *h = dlopen(dl_path, RTLD_NOW);
    CHECK(h != NULL, "dlopen %s: %s", dl_path, dlerror());
    if (!h)
        return;
    long (*f)(long) = (long (*)(long))dlsym(h, "capi_dl_func");
    CHECK(f != NULL, "dlsym");
    CHECK(f(1) == 8, "untraced until refreshed");
    CHECK(s.calls == 0, "%ld", s.calls);
    CHECK(ftramp_refresh() == 0, "refresh after dlopen");
    CHECK(ftramp_site_dispatch(ADDR(f)) == FTRAMP_SITE_DIRECT_ARGS, "the new module's site is traced");
    CHECK(f(1) == 8 && s.calls == 1, "traced after refresh: %ld", s.calls);
    capi_tracee_add(1, 2);
    CHECK(s.calls == 2, "%ld", s.calls);
    CHECK(ftramp_unregister_ftrace_function(op) == 0, "unregister");
    CHECK(dlclose(h) == 0, "dlclose");
    CHECK(ftramp_refresh() == 0, "refresh after dlclose");
    CHECK(ftramp_register_ftrace_function(op) == 0, "register once more (only capi_tracee_add left)");
    capi_tracee_add(1, 2);
    CHECK(s.calls == 3, "%ld", s.calls);
    CHECK(ftramp_unregister_ftrace_function(op) == 0 && ftramp_ops_free(op) == 0, "done");
}

#define THREADS 4
#define CALLS 20000

static void *caller(void *arg)
{
    (void)arg;
    for (int i = 0; i < CALLS; i++)
        capi_tracee_add(i, 1);
    return NULL;
}

static void test_threads(void)
{
    struct seen whole, churn;
    struct ftrace_ops *op = new_ops(count, 0, &whole, "capi_tracee_add");
    CHECK(ftramp_register_ftrace_function(op) == 0, "register for the whole run");
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, caller, NULL);
    int cycles = 0, errors = 0;
    for (; cycles < 20; cycles++) {
        struct ftrace_ops *o = new_ops(count, 0, &churn, "capi_tracee_*");
        errors += ftramp_register_ftrace_function(o) != 0;
        errors += ftramp_unregister_ftrace_function(o) != 0;
        errors += ftramp_ops_free(o) != 0;
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    CHECK(errors == 0, "%d errors in %d register/unregister cycles", errors, cycles);
    CHECK(whole.calls == THREADS * CALLS, "every call counted: %ld of %d", whole.calls, THREADS * CALLS);
    CHECK(ftramp_unregister_ftrace_function(op) == 0 && ftramp_ops_free(op) == 0, "done");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <dlopen test library>\n", argv[0]);
        return 2;
    }
    printf("ftramp C API test on %s\n", ftramp_arch());
    test_errors();
    test_symbol_filter();
    test_glob_notrace_and_list();
    test_save_regs();
    test_ipmodify_and_writes();
    test_recursion_and_callback_limits();
    test_dlopen(argv[1]);
    test_threads();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
