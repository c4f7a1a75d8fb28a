/*
 * gpu_table.h: the GPUs infer --dry-run --gpu NAME can plan for. Data only;
 * engine/gpus.c looks rows up and derives the planner's two figures.
 *
 * Each row: the name (as NVIDIA sells the card; a variant's memory size is
 * part of the name where the card came in several), memory as sold in GB,
 * the datasheet memory bandwidth in GB/s (data rate x bus width), the host
 * link (PCIe generation and lanes), the compute capability, and where the
 * figures come from. Figures are NVIDIA's published specifications (the
 * product pages of each GeForce series and the data-center datasheets),
 * cross-checked against third-party specification listings; none is
 * measured here. Included only once a vendor figure was found: add a card
 * the same way (and a test line in tests/test_plan.c if it matters).
 *
 * Several cards use fewer PCIe lanes than their slot: the RTX 4060 and
 * 4060 Ti are PCIe 4.0 x8 and the RTX 5060 Ti is PCIe 5.0 x8, so they
 * stream at half the rate of a x16 card of their generation.
 */
#ifndef ENGINE_GPU_TABLE_H
#define ENGINE_GPU_TABLE_H

typedef struct gpu_row {
    const char *name;
    double vram_gb;
    double mem_gbps;
    int pcie_gen, pcie_lanes;
    int cc_major, cc_minor;
    const char *source;
} gpu_row;

static const gpu_row GPU_TABLE[] = {
    /* Turing (GeForce RTX 20, T4): compute capability 7.5, PCIe 3.0 */
    {"RTX 2060", 6, 336.0, 3, 16, 7, 5, "NVIDIA GeForce RTX 2060 specs (14 Gbps GDDR6 x 192 bit)"},
    {"RTX 2080 Ti", 11, 616.0, 3, 16, 7, 5, "NVIDIA GeForce RTX 2080 Ti specs (14 Gbps GDDR6 x 352 bit)"},
    {"T4", 16, 320.0, 3, 16, 7, 5, "NVIDIA T4 datasheet (GDDR6, 320 GB/s; PCIe Gen3 x16)"},
    /* Ampere (GeForce RTX 30, A10): 8.6; A100: 8.0; PCIe 4.0 */
    {"RTX 3060 12G", 12, 360.0, 4, 16, 8, 6, "NVIDIA GeForce RTX 3060 specs (15 Gbps GDDR6 x 192 bit)"},
    {"RTX 3070", 8, 448.0, 4, 16, 8, 6, "NVIDIA GeForce RTX 3070 specs (14 Gbps GDDR6 x 256 bit)"},
    {"RTX 3080 10G", 10, 760.0, 4, 16, 8, 6, "NVIDIA GeForce RTX 3080 specs (19 Gbps GDDR6X x 320 bit)"},
    {"RTX 3090", 24, 936.0, 4, 16, 8, 6, "NVIDIA GeForce RTX 3090 specs (19.5 Gbps GDDR6X x 384 bit)"},
    {"A10", 24, 600.0, 4, 16, 8, 6, "NVIDIA A10 datasheet (GDDR6, 600 GB/s; PCIe Gen4 x16)"},
    {"A100 40GB PCIe", 40, 1555.0, 4, 16, 8, 0, "NVIDIA A100 datasheet (HBM2, 1,555 GB/s; PCIe Gen4)"},
    {"A100 80GB PCIe", 80, 1935.0, 4, 16, 8, 0, "NVIDIA A100 datasheet (HBM2e, 1,935 GB/s; PCIe Gen4)"},
    {"A100 80GB SXM", 80, 2039.0, 4, 16, 8, 0, "NVIDIA A100 datasheet (HBM2e, 2,039 GB/s; host link PCIe Gen4)"},
    /* Ada (GeForce RTX 40, L4, L40S): 8.9, PCIe 4.0 */
    {"RTX 4060", 8, 272.0, 4, 8, 8, 9, "NVIDIA GeForce RTX 4060 specs (17 Gbps GDDR6 x 128 bit; PCIe 4.0 x8)"},
    {"RTX 4060 Ti 16G", 16, 288.0, 4, 8, 8, 9, "NVIDIA GeForce RTX 4060 Ti specs (18 Gbps GDDR6 x 128 bit; PCIe 4.0 x8)"},
    {"RTX 4070", 12, 504.0, 4, 16, 8, 9, "NVIDIA GeForce RTX 4070 specs (21 Gbps GDDR6X x 192 bit)"},
    {"RTX 4080", 16, 716.8, 4, 16, 8, 9, "NVIDIA GeForce RTX 4080 specs (22.4 Gbps GDDR6X x 256 bit)"},
    {"RTX 4090", 24, 1008.0, 4, 16, 8, 9, "NVIDIA GeForce RTX 4090 specs (21 Gbps GDDR6X x 384 bit)"},
    {"L4", 24, 300.0, 4, 16, 8, 9, "NVIDIA L4 datasheet (GDDR6, 300 GB/s; PCIe Gen4 x16)"},
    {"L40S", 48, 864.0, 4, 16, 8, 9, "NVIDIA L40S datasheet (GDDR6, 864 GB/s; PCIe Gen4 x16)"},
    /* Hopper: 9.0, PCIe 5.0 */
    {"H100 PCIe", 80, 2000.0, 5, 16, 9, 0, "NVIDIA H100 datasheet (HBM2e, 2 TB/s; PCIe Gen5)"},
    {"H100 SXM", 80, 3350.0, 5, 16, 9, 0, "NVIDIA H100 datasheet (HBM3, 3.35 TB/s; host link PCIe Gen5 x16)"},
    {"H200 SXM", 141, 4800.0, 5, 16, 9, 0, "NVIDIA H200 datasheet (HBM3e, 4.8 TB/s; host link PCIe Gen5 x16)"},
    /* Blackwell (GeForce RTX 50): 12.0, PCIe 5.0 */
    {"RTX 5060 Ti 16G", 16, 448.0, 5, 8, 12, 0, "NVIDIA GeForce RTX 5060 Ti specs (28 Gbps GDDR7 x 128 bit; PCIe 5.0 x8)"},
    {"RTX 5070", 12, 672.0, 5, 16, 12, 0, "NVIDIA GeForce RTX 5070 specs (28 Gbps GDDR7 x 192 bit)"},
    {"RTX 5080", 16, 960.0, 5, 16, 12, 0, "NVIDIA GeForce RTX 5080 specs (30 Gbps GDDR7 x 256 bit)"},
    {"RTX 5090", 32, 1792.0, 5, 16, 12, 0, "NVIDIA GeForce RTX 5090 specs (28 Gbps GDDR7 x 512 bit)"},
};

#endif
