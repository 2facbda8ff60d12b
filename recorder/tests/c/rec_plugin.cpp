/*
 * A C++ library whose static initialiser throws and catches exceptions
 * through traced frames.  A C program that dlopens it loads libstdc++ with
 * it, whose unwinder hooks cannot be in place before it is relocated: the
 * recorder must not trace the constructor then (an unwinder meeting a
 * hijacked return it was not told about calls std::terminate).
 */
#include <stdexcept>

__attribute__((noinline)) int plugin_thrower(int x)
{
	if (x > 0)
		throw std::runtime_error("plugin");
	return x;
}

__attribute__((noinline)) int plugin_middle(int x)
{
	return plugin_thrower(x) + 1;
}

static int caught;

struct PluginInit {
	PluginInit()
	{
		for (int i = 0; i < 5; i++) {
			try {
				plugin_middle(i + 1);
			} catch (const std::exception &) {
				caught++;
			}
		}
	}
};

static PluginInit plugin_init;

extern "C" int plugin_caught(void)
{
	return caught;
}

/* Catches `n` exceptions thrown two traced frames down; returns how many. */
extern "C" __attribute__((noinline)) int plugin_catch(int n)
{
	int got = 0;
	for (int i = 0; i < n; i++) {
		try {
			plugin_middle(i + 1);
		} catch (const std::exception &) {
			got++;
		}
	}
	return got;
}
