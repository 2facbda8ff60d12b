/* Built without patch-site flags: the recorder says how to build it, and it runs. */
#include <stdio.h>
__attribute__((noinline)) int plain(int x) { return x + 1; }
int main(void) { printf("ran %d\n", plain(41)); return 0; }
