//! The resolver of `acm-core-nostd` as firmware: [`scenario`] feeds it a recorded sequence of
//! real MADs and client requests in virtual time and writes every output as a canonical
//! record. On a Cortex-M (`target_os = "none"`) the transcript goes out through semihosting
//! and QEMU exits with the result; on a host it goes to stdout. `scripts/firmware-qemu.sh`
//! runs both and compares them byte for byte (docs/firmware.md).
//!
//! ```text
//! cd acm-core-nostd/examples/firmware
//! cargo run --release                                  # host transcript
//! cargo run --release --target thumbv7em-none-eabihf   # the same under qemu-system-arm
//! ```
//!
//! On the firmware the transcript is followed by `measure` lines: the instructions each
//! measured part of the sequence took, read from SysTick under QEMU's `-icount` (see
//! [`firmware`]).
#![cfg_attr(target_os = "none", no_std, no_main)]
#![deny(unsafe_code)]

mod scenario;

#[cfg(target_os = "none")]
mod firmware {
    //! The Cortex-M side: semihosting output, a SysTick meter, the entry point.
    //!
    //! **Instruction counts.** Under `qemu-system-arm -icount shift=S` the virtual clock
    //! advances exactly 2^S ns per guest instruction. SysTick, clocked from the CPU clock
    //! (mps2's SYSCLK, 25 MHz: one tick per 40 ns of virtual time), then counts instructions
    //! deterministically: a part that ran `n` instructions reads `floor(n·2^S/40)` or one
    //! more tick. With S = [`ICOUNT_SHIFT`] = 7 a tick is 0.3125 instruction, so
    //! `round(ticks·40/2^S)` is exact; the meter's own cost ([`Measure::Empty`]) is
    //! subtracted. Without `-icount` the numbers are wall-clock noise.
    //!
    //! **Stack.** cortex-m-rt paints the stack at reset (`paint-stack`); after the run the
    //! deepest word whose paint is gone gives the peak stack use.

    use crate::scenario::{self, Measure, Meter, Sink, Slabs};
    use cortex_m::peripheral::syst::SystClkSource;
    use cortex_m::peripheral::SYST;
    use cortex_m_rt::entry;
    use cortex_m_semihosting::{debug, hprintln};
    use panic_semihosting as _;

    /// The `-icount shift` `scripts/firmware-qemu.sh` runs QEMU with.
    pub const ICOUNT_SHIFT: u32 = 7;
    /// mps2-an386's CPU clock (QEMU's `SYSCLK_FRQ`), which SysTick counts with `CLKSOURCE`=1.
    pub const CPU_HZ: u64 = 25_000_000;

    struct Semihosting;

    impl Sink for Semihosting {
        fn line(&mut self, s: &str) {
            hprintln!("{}", s);
        }
    }

    const PARTS: [(Measure, &str); 9] = [
        (Measure::Empty, "empty"),
        (Measure::JoinReply, "join-reply"),
        (Measure::AcmAnswer, "acm-answer"),
        (Measure::MissRequest, "miss-request"),
        (Measure::MissReply, "miss-reply"),
        (Measure::HitClassify, "hit-classify"),
        (Measure::HitLookup, "hit-lookup"),
        (Measure::HitRespond, "hit-respond"),
        (Measure::HitResolver, "hit-resolver"),
    ];

    /// SysTick as a down-counter over its whole 24 bits.
    struct SysTickMeter {
        t0: u32,
        ticks: [Option<u32>; PARTS.len()],
    }

    impl Meter for SysTickMeter {
        #[inline(never)]
        fn begin(&mut self) {
            self.t0 = SYST::get_current();
        }
        #[inline(never)]
        fn end(&mut self, what: Measure) {
            let t1 = SYST::get_current();
            let d = self.t0.wrapping_sub(t1) & 0x00ff_ffff;
            if let Some(i) = PARTS.iter().position(|(m, _)| *m == what) {
                self.ticks[i] = Some(d);
            }
        }
    }

    impl SysTickMeter {
        /// Instructions of part `m`, the meter's own cost taken off (0 if not measured).
        fn instructions(&self, m: Measure) -> u64 {
            let get = |m: Measure| {
                let i = PARTS.iter().position(|(x, _)| *x == m)?;
                self.ticks[i].map(instructions)
            };
            let empty = get(Measure::Empty).unwrap_or(0);
            match m {
                Measure::Empty => empty,
                _ => get(m).map_or(0, |n| n.saturating_sub(empty)),
            }
        }
    }

    /// Instructions in `ticks` SysTick ticks (see the module docs).
    fn instructions(ticks: u32) -> u64 {
        let ns_per_tick = 1_000_000_000 / CPU_HZ;
        (u64::from(ticks) * ns_per_tick + (1 << (ICOUNT_SHIFT - 1))) >> ICOUNT_SHIFT
    }

    /// Peak stack use in bytes: from the top of the stack down to the deepest word whose
    /// paint is gone.
    fn stack_peak() -> usize {
        extern "C" {
            // From cortex-m-rt's link.x: the stack's top (initial SP) and its lowest address.
            static _stack_start: u32;
            static _stack_end: u32;
        }
        let top = core::ptr::addr_of!(_stack_start) as usize;
        let mut p = core::ptr::addr_of!(_stack_end);
        while (p as usize) < top {
            #[allow(unsafe_code)]
            // SAFETY: `p` is word-aligned (link.x asserts `_stack_end % 4 == 0`) and in
            // [_stack_end, _stack_start), RAM that link.x reserves for the stack and
            // cortex-m-rt painted at reset; below the live SP nothing uses it (no interrupt
            // is enabled), so this is a plain load of initialised memory nobody writes.
            let w = unsafe { core::ptr::read_volatile(p) };
            if w != cortex_m_rt::STACK_PAINT_VALUE {
                break;
            }
            p = p.wrapping_add(1);
        }
        top - p as usize
    }

    #[entry]
    fn main() -> ! {
        // cortex-m-rt turns this into a `&'static mut Slabs` (the entry runs once): the
        // resolver's tables in .bss.
        static mut SLABS: Slabs = Slabs::new();

        let mut meter = SysTickMeter {
            t0: 0,
            ticks: [None; PARTS.len()],
        };
        // SysTick free-running from the CPU clock over its 24 bits; the meter reads it.
        if let Some(p) = cortex_m::Peripherals::take() {
            let mut syst = p.SYST;
            syst.set_clock_source(SystClkSource::Core);
            syst.set_reload(0x00ff_ffff);
            syst.clear_current();
            syst.enable_counter();
        }
        let s = scenario::run(SLABS, &mut Semihosting, &mut meter);

        // Not part of the transcript the host prints: only after its `end` line.
        hprintln!("measure icount-shift={} cpu-hz={}", ICOUNT_SHIFT, CPU_HZ);
        for ((m, name), t) in PARTS.iter().zip(meter.ticks) {
            match t {
                Some(t) => hprintln!(
                    "measure {} ticks={} instructions={}",
                    name,
                    t,
                    meter.instructions(*m)
                ),
                None => hprintln!("measure {} not-run", name),
            }
        }
        let hit = meter.instructions(Measure::HitClassify)
            + meter.instructions(Measure::HitLookup)
            + meter.instructions(Measure::HitRespond);
        let miss =
            meter.instructions(Measure::MissRequest) + meter.instructions(Measure::MissReply);
        hprintln!(
            "measure per-hit={} per-hit-resolver={} per-miss={} (instructions)",
            hit,
            meter.instructions(Measure::HitResolver),
            miss
        );
        hprintln!(
            "measure stack-peak={} resolver={} tables={} cache-slots={} (bytes)",
            stack_peak(),
            core::mem::size_of::<
                acm_core_nostd::resolver::Resolver<&'static mut Slabs, &'static scenario::FwCache>,
            >(),
            core::mem::size_of::<Slabs>(),
            core::mem::size_of::<[acm_core_nostd::cache::PathSlot; scenario::CACHE_SLOTS]>()
                + core::mem::size_of::<[acm_core_nostd::cache::AddrSlot; scenario::CACHE_SLOTS]>()
        );

        debug::exit(if s.failed == 0 {
            debug::EXIT_SUCCESS
        } else {
            debug::EXIT_FAILURE
        });
        #[allow(clippy::empty_loop)]
        loop {}
    }
}

#[cfg(not(target_os = "none"))]
fn main() {
    use std::io::Write;

    struct Stdout<W: Write>(W);

    impl<W: Write> scenario::Sink for Stdout<W> {
        fn line(&mut self, s: &str) {
            // A lost line makes the comparison fail, which is the report.
            let _ = writeln!(self.0, "{s}");
        }
    }

    /// The host measures nothing (its transcript is the firmware's without `measure` lines).
    struct NoMeter;

    impl scenario::Meter for NoMeter {
        fn begin(&mut self) {}
        fn end(&mut self, _: scenario::Measure) {}
    }

    let mut tables = Box::new(scenario::Slabs::new());
    let mut out = Stdout(std::io::BufWriter::new(std::io::stdout().lock()));
    let s = scenario::run(&mut *tables, &mut out, &mut NoMeter);
    let _ = out.0.flush();
    std::process::exit(if s.failed == 0 { 0 } else { 1 });
}
