/* Aggregates of the ABI tests (tracee_abi.c, abi_driver.c). */
struct abi_big {
	long v[6];
};
struct abi_hfa {
	double a, b, c, d;
};
struct abi_mixed {
	long i;
	double d;
};
struct abi_fpair {
	float x, y;
};
struct abi_pair {
	long a, b;
};

/* Calls every tracee of tracee_abi.c once with fixed arguments and
 * appends each result's bytes to out (ABI_OUT_MAX bytes); returns the
 * number of calls made. */
#define ABI_OUT_MAX 512
int abi_run(unsigned char *out);
/* The tracees' addresses, 0-terminated. */
extern void *const abi_tracees[];
/* What abi_run kept, in order: each result's call (its source text), and
 * where its bytes are in out. */
struct abi_result {
	const char *call;
	unsigned long offset, size;
};
#define ABI_RESULTS_MAX 32
extern struct abi_result abi_results[ABI_RESULTS_MAX];
extern int abi_nresults;
/* Fills the caller-saved registers that carry arguments and return values
 * (integer and vector/FP) with a pattern: what a callback may do. */
void abi_clobber(void);
