;; Batched matrix product for tfjs-backend-wasm's heap: C[n] = A[n] · B[n], float32, row-major, contiguous,
;; n batches of [m, k] · [k, p] → [m, p]. tfjs-backend-wasm 4.22 runs a batched BatchMatMul (attention's
;; q·kᵀ and weights·v, [B·H, T, T] and [B·H, T, hd]) in a scalar loop, not XNNPACK: about 1 GMAC/s, half of
;; a `tiny` step's time for a twentieth of its arithmetic. Here each output row is built 16 columns at a time in
;; four f32x4 accumulators (then 4 at a time, then one by one), summing over k in order: the same bytes on
;; every machine, as audits need. Imports tfjs-backend-wasm's own memory: operands and result stay in place.
;; Built into batch-matmul-module.ts by scripts/build-wasm-kernels.ts (a test checks the two agree).
(module
  (import "env" "memory" (memory 1))
  (func (export "bmm") (param $a i32) (param $b i32) (param $c i32) (param $n i32) (param $m i32) (param $k i32) (param $p i32)
    (local $bi i32) (local $i i32) (local $j i32) (local $kk i32)
    (local $arow i32) (local $bbase i32) (local $crow i32) (local $bp i32)
    (local $aval v128) (local $acc0 v128) (local $acc1 v128) (local $acc2 v128) (local $acc3 v128)
    (local $p16 i32) (local $p4 i32) (local $rowb i32) (local $s f32)
    (local.set $p16 (i32.and (local.get $p) (i32.const -16)))
    (local.set $p4 (i32.and (local.get $p) (i32.const -4)))
    (local.set $rowb (i32.shl (local.get $p) (i32.const 2)))
    (local.set $bi (i32.const 0))
    (block $bdone (loop $bloop
      (br_if $bdone (i32.ge_u (local.get $bi) (local.get $n)))
      (local.set $bbase (i32.add (local.get $b) (i32.shl (i32.mul (local.get $bi) (i32.mul (local.get $k) (local.get $p))) (i32.const 2))))
      (local.set $i (i32.const 0))
      (block $idone (loop $iloop
        (br_if $idone (i32.ge_u (local.get $i) (local.get $m)))
        (local.set $arow (i32.add (local.get $a) (i32.shl (i32.mul (i32.add (i32.mul (local.get $bi) (local.get $m)) (local.get $i)) (local.get $k)) (i32.const 2))))
        (local.set $crow (i32.add (local.get $c) (i32.shl (i32.mul (i32.add (i32.mul (local.get $bi) (local.get $m)) (local.get $i)) (local.get $p)) (i32.const 2))))
        ;; 16 columns at a time
        (local.set $j (i32.const 0))
        (block $jdone (loop $jloop
          (br_if $jdone (i32.ge_u (local.get $j) (local.get $p16)))
          (local.set $acc0 (v128.const i32x4 0 0 0 0))
          (local.set $acc1 (v128.const i32x4 0 0 0 0))
          (local.set $acc2 (v128.const i32x4 0 0 0 0))
          (local.set $acc3 (v128.const i32x4 0 0 0 0))
          (local.set $bp (i32.add (local.get $bbase) (i32.shl (local.get $j) (i32.const 2))))
          (local.set $kk (i32.const 0))
          (block $kdone (loop $kloop
            (br_if $kdone (i32.ge_u (local.get $kk) (local.get $k)))
            (local.set $aval (f32x4.splat (f32.load (i32.add (local.get $arow) (i32.shl (local.get $kk) (i32.const 2))))))
            (local.set $acc0 (f32x4.add (local.get $acc0) (f32x4.mul (local.get $aval) (v128.load offset=0 (local.get $bp)))))
            (local.set $acc1 (f32x4.add (local.get $acc1) (f32x4.mul (local.get $aval) (v128.load offset=16 (local.get $bp)))))
            (local.set $acc2 (f32x4.add (local.get $acc2) (f32x4.mul (local.get $aval) (v128.load offset=32 (local.get $bp)))))
            (local.set $acc3 (f32x4.add (local.get $acc3) (f32x4.mul (local.get $aval) (v128.load offset=48 (local.get $bp)))))
            (local.set $bp (i32.add (local.get $bp) (local.get $rowb)))
            (local.set $kk (i32.add (local.get $kk) (i32.const 1)))
            (br $kloop)))
          (v128.store offset=0 (i32.add (local.get $crow) (i32.shl (local.get $j) (i32.const 2))) (local.get $acc0))
          (v128.store offset=16 (i32.add (local.get $crow) (i32.shl (local.get $j) (i32.const 2))) (local.get $acc1))
          (v128.store offset=32 (i32.add (local.get $crow) (i32.shl (local.get $j) (i32.const 2))) (local.get $acc2))
          (v128.store offset=48 (i32.add (local.get $crow) (i32.shl (local.get $j) (i32.const 2))) (local.get $acc3))
          (local.set $j (i32.add (local.get $j) (i32.const 16)))
          (br $jloop)))
        ;; 4 at a time
        (block $j4done (loop $j4loop
          (br_if $j4done (i32.ge_u (local.get $j) (local.get $p4)))
          (local.set $acc0 (v128.const i32x4 0 0 0 0))
          (local.set $bp (i32.add (local.get $bbase) (i32.shl (local.get $j) (i32.const 2))))
          (local.set $kk (i32.const 0))
          (block $k4done (loop $k4loop
            (br_if $k4done (i32.ge_u (local.get $kk) (local.get $k)))
            (local.set $acc0 (f32x4.add (local.get $acc0) (f32x4.mul (f32x4.splat (f32.load (i32.add (local.get $arow) (i32.shl (local.get $kk) (i32.const 2))))) (v128.load (local.get $bp)))))
            (local.set $bp (i32.add (local.get $bp) (local.get $rowb)))
            (local.set $kk (i32.add (local.get $kk) (i32.const 1)))
            (br $k4loop)))
          (v128.store (i32.add (local.get $crow) (i32.shl (local.get $j) (i32.const 2))) (local.get $acc0))
          (local.set $j (i32.add (local.get $j) (i32.const 4)))
          (br $j4loop)))
        ;; the rest, one by one
        (block $j1done (loop $j1loop
          (br_if $j1done (i32.ge_u (local.get $j) (local.get $p)))
          (local.set $s (f32.const 0))
          (local.set $bp (i32.add (local.get $bbase) (i32.shl (local.get $j) (i32.const 2))))
          (local.set $kk (i32.const 0))
          (block $k1done (loop $k1loop
            (br_if $k1done (i32.ge_u (local.get $kk) (local.get $k)))
            (local.set $s (f32.add (local.get $s) (f32.mul (f32.load (i32.add (local.get $arow) (i32.shl (local.get $kk) (i32.const 2)))) (f32.load (local.get $bp)))))
            (local.set $bp (i32.add (local.get $bp) (local.get $rowb)))
            (local.set $kk (i32.add (local.get $kk) (i32.const 1)))
            (br $k1loop)))
          (f32.store (i32.add (local.get $crow) (i32.shl (local.get $j) (i32.const 2))) (local.get $s))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br $j1loop)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $iloop)))
      (local.set $bi (i32.add (local.get $bi) (i32.const 1)))
      (br $bloop)))
  )
)
