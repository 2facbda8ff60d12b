/* A C program that links ftramp's build-time trampoline object.
 *
 *   examples/c_object/run.sh        # builds and runs it (x86_64 or aarch64 host)
 *
 * `work` is compiled with patch sites (see run.sh); main() turns its site
 * into a call to ftrace_caller, whose list function here prints each call's
 * arguments, and routes one return through return_to_handler to print the
 * result.
 */
#include "ftramp.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

long work(long a, long b); /* in work.c, built with `ftramp cflags` */

struct ftrace_ops {
	ftrace_func_t func;
};

static unsigned long saved_return;

static void my_tracer(unsigned long ip, unsigned long parent_ip, struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	(void)op;
	printf("enter %#lx (called from %#lx): a=%ld b=%ld\n", ip, parent_ip, (long)ftrace_regs_get_argument(fregs, 0),
	       (long)ftrace_regs_get_argument(fregs, 1));
	/* Also see the exit: remember where `work` returns and go through
	 * return_to_handler instead (one level deep is enough here). */
	saved_return = ftrace_regs_get_return_address(fregs);
	ftrace_regs_set_return_address(fregs, (unsigned long)return_to_handler);
}

static struct ftrace_ops my_ops = { my_tracer };

void ftrace_ops_list_func(unsigned long ip, unsigned long parent_ip, struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	op->func(ip, parent_ip, op, fregs);
}

unsigned long ftrace_return_to_handler(struct ftrace_regs *fregs)
{
	printf("exit: returns %ld\n", (long)ftrace_regs_get_return_value(fregs));
	return saved_return;
}

static void write_code(unsigned long addr, const void *bytes, size_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	unsigned long start = addr & ~(unsigned long)(page - 1);
	mprotect((void *)start, 2 * page, PROT_READ | PROT_WRITE | PROT_EXEC);
	memcpy((void *)addr, bytes, len);
	mprotect((void *)start, 2 * page, PROT_READ | PROT_EXEC);
	__builtin___clear_cache((char *)addr, (char *)addr + len);
}

int main(void)
{
	static const unsigned char nop[] = FTRACE_SITE_NOP;
	unsigned long site = (unsigned long)work;
	unsigned char call[FTRACE_SITE_SIZE];

	printf("untraced: work(2, 3) = %ld\n", work(2, 3));
	if (memcmp((void *)site, nop, sizeof(nop)) != 0) {
		fprintf(stderr, "work() has no patch site: build it with `ftramp cflags`\n");
		return 1;
	}
#if defined(__x86_64__)
	long rel = (long)ftrace_caller - (long)(site + 5);
	call[0] = 0xe8; /* call rel32 */
	memcpy(call + 1, &(int){ (int)rel }, 4);
#elif defined(__aarch64__)
	unsigned int insn[2] = { 0xaa1e03e9 /* mov x9, x30 */,
				 0x94000000 | ((((long)ftrace_caller - (long)(site + 4)) >> 2) & 0x3ffffff) /* bl */ };
	memcpy(call, insn, 8);
#else
#error "this example patches x86_64 and aarch64 sites"
#endif
	function_trace_op = &my_ops;
	write_code(site, call, sizeof(call));
	printf("traced:   work(2, 3) = %ld\n", work(2, 3));
	write_code(site, nop, sizeof(nop));
	printf("restored: work(2, 3) = %ld\n", work(2, 3));
	return 0;
}
