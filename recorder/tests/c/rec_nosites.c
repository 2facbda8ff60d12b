/*
 * Built without patch-site flags: the recorder says how to build it, and it runs.
 *
 *   rec_nosites                  prints `ran 42`
 *   rec_nosites dlopen LIB N     loads LIB (rec_ctor_lib.c's library, built with
 *                                sites), calls its ctorlib_ctor_calls N times
 *                                through dlsym and unloads it: a program with no
 *                                sites of its own whose plugin has them.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) int plain(int x) { return x + 1; }

int main(int argc, char **argv)
{
	if (argc > 3 && !strcmp(argv[1], "dlopen")) {
		void *h = dlopen(argv[2], RTLD_NOW);
		if (!h) {
			fprintf(stderr, "dlopen: %s\n", dlerror());
			return 2;
		}
		long (*f)(void) = (long (*)(void))dlsym(h, "ctorlib_ctor_calls");
		if (!f) {
			fprintf(stderr, "dlsym: %s\n", dlerror());
			return 2;
		}
		long n = atol(argv[3]), sum = 0;
		for (long i = 0; i < n; i++)
			sum += f();
		printf("plugin_calls %ld\nctor_calls %ld\n", n, sum / (n ? n : 1));
		fflush(stdout);
		dlclose(h);
		return 0;
	}
	printf("ran %d\n", plain(41));
	return 0;
}
