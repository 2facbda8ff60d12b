//! `execl`, `execlp` and `execle` interposers.  They are variadic, which
//! stable Rust cannot define, so each is a naked function that stores the
//! integer argument registers next to each other and calls [`execl_impl`]
//! with a pointer to them and to the caller's stack arguments (Linux's
//! x86_64 and aarch64 ABIs pass variadic pointer arguments like named
//! ones: registers first, then the stack).  `execl_impl` collects the
//! argument list and calls the `execv`/`execvp`/`execve` interposers.

use std::ffi::{c_char, c_int};

/// Argument registers: rdi rsi rdx rcx r8 r9 / x0..x7.
#[cfg(target_arch = "x86_64")]
const REG_ARGS: usize = 6;
#[cfg(target_arch = "aarch64")]
const REG_ARGS: usize = 8;

const EXECL: u32 = 0;
const EXECLP: u32 = 1;
const EXECLE: u32 = 2;

/// The variadic call's `i`-th integer argument.
///
/// # Safety
/// `regs` holds `REG_ARGS` words and `stack` the caller's stack arguments,
/// as the naked stubs lay them out; `i` is within the call's arguments.
unsafe fn arg(regs: *const usize, stack: *const usize, i: usize) -> usize {
    // SAFETY: per the caller's contract.
    unsafe {
        if i < REG_ARGS {
            *regs.add(i)
        } else {
            *stack.add(i - REG_ARGS)
        }
    }
}

/// Collects `path, arg0, ..., NULL[, envp]` and runs the matching exec.
extern "C" fn execl_impl(regs: *const usize, stack: *const usize, mode: u32) -> c_int {
    // SAFETY: the stubs pass their saved registers and stack pointer; the
    // caller passed a NULL-terminated list as execl requires (reading
    // stops at the NULL, and at most 4096 arguments are read).
    unsafe {
        let path = arg(regs, stack, 0) as *const c_char;
        let mut argv: Vec<*const c_char> = Vec::new();
        let mut i = 1;
        loop {
            let a = arg(regs, stack, i) as *const c_char;
            argv.push(a);
            i += 1;
            if a.is_null() || argv.len() > 4096 {
                break;
            }
        }
        if argv.last().is_some_and(|a| !a.is_null()) {
            *libc::__errno_location() = libc::E2BIG;
            return -1;
        }
        match mode {
            EXECLP => crate::execvp(path, argv.as_ptr()),
            EXECLE => {
                let envp = arg(regs, stack, i) as *const *const c_char;
                crate::execve(path, argv.as_ptr(), envp)
            }
            _ => crate::execv(path, argv.as_ptr()),
        }
    }
}

macro_rules! variadic_exec {
    ($name:ident, $mode:expr) => {
        /// # Safety
        /// As libc's function of the same name.
        #[no_mangle]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name(path: *const c_char, arg: *const c_char) -> c_int {
            #[cfg(target_arch = "x86_64")]
            std::arch::naked_asm!(
                // rsp = 8 mod 16 at entry; after push rbp and 48 bytes: 0 mod 16.
                "push rbp",
                "mov rbp, rsp",
                "sub rsp, 48",
                "mov [rsp], rdi",
                "mov [rsp + 8], rsi",
                "mov [rsp + 16], rdx",
                "mov [rsp + 24], rcx",
                "mov [rsp + 32], r8",
                "mov [rsp + 40], r9",
                "mov rdi, rsp",
                "lea rsi, [rbp + 16]",
                "mov edx, {mode}",
                "call {imp}",
                "leave",
                "ret",
                mode = const $mode,
                imp = sym execl_impl,
            );
            #[cfg(target_arch = "aarch64")]
            std::arch::naked_asm!(
                "stp x29, x30, [sp, #-80]!",
                "mov x29, sp",
                "stp x0, x1, [sp, #16]",
                "stp x2, x3, [sp, #32]",
                "stp x4, x5, [sp, #48]",
                "stp x6, x7, [sp, #64]",
                "add x0, sp, #16",
                "add x1, sp, #80",
                "mov w2, #{mode}",
                "bl {imp}",
                "ldp x29, x30, [sp], #80",
                "ret",
                mode = const $mode,
                imp = sym execl_impl,
            );
        }
    };
}

variadic_exec!(execl, EXECL);
variadic_exec!(execlp, EXECLP);
variadic_exec!(execle, EXECLE);
