/* The C calling-convention cases of tests/c/tracee_abi.c as a program:
 * prints how many calls abi_run made and every result's bytes, so a
 * recorded run's output can be compared with an untraced one. */
#include <stdio.h>
#include "abi.h"

int main(void)
{
	unsigned char out[ABI_OUT_MAX] = { 0 };
	int calls = abi_run(out);
	printf("calls %d\n", calls);
	for (int i = 0; i < ABI_OUT_MAX; i++)
		printf("%02x%s", out[i], i % 32 == 31 ? "\n" : "");
	return calls > 0 ? 0 : 1;
}
