/*
 * Links rec_ctor_lib.c's library: its constructor ran before main (and its
 * destructor and atexit handler run after).  Prints the constructor's
 * count; main calls nothing traced of the library.
 */
#include <stdio.h>

long ctorlib_ctor_calls(void);

int main(void)
{
	printf("ctorlib_ctor %ld\n", ctorlib_ctor_calls());
	return 0;
}
