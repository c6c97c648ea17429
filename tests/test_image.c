/* test_image: image_resample (cifar-predict --resize) on hand-computed cases:
 * bilinear with pixel centres aligned (OpenCV INTER_LINEAR, PyTorch
 * align_corners=False) up and down, edges clamped, the same shape copied, gray to
 * RGB copied, RGB to gray by BT.601 luma, every result rounded to nearest. */
#include <string.h>

#include "data/image.h"
#include "unit.h"

static void expect_row(const char *what, const uint8_t *got, const uint8_t *want, size_t n) {
    EXPECT(memcmp(got, want, n) == 0, "%s: got %d %d %d %d, want %d %d %d %d", what, got[0],
           n > 1 ? got[1] : 0, n > 2 ? got[2] : 0, n > 3 ? got[3] : 0, want[0], n > 1 ? want[1] : 0,
           n > 2 ? want[2] : 0, n > 3 ? want[3] : 0);
}

int main(void) {
    uint8_t out[64];
    /* 2 -> 4 wide: source x = (i + 0.5) / 2 - 0.5 = -0.25 (clamped to 0), 0.25, 0.75, 1.25 (the last pixel) */
    const uint8_t two[] = {0, 100};
    image_resample(two, (ImageShape){2, 1, 1}, out, (ImageShape){4, 1, 1});
    expect_row("upsample 2 -> 4", out, (const uint8_t[]){0, 25, 75, 100}, 4);
    /* 4 -> 2: source x = 0.5 and 2.5, the mean of each pair */
    const uint8_t four[] = {0, 100, 200, 250};
    image_resample(four, (ImageShape){4, 1, 1}, out, (ImageShape){2, 1, 1});
    expect_row("downsample 4 -> 2", out, (const uint8_t[]){50, 225}, 2);
    /* rounding: 3 -> 2 gives x = 0.25 and 1.75: 0.75 * 0 + 0.25 * 1 = 0.25 -> 0, 0.25 * 1 + 0.75 * 2 = 1.75 -> 2 */
    const uint8_t three[] = {0, 1, 2};
    image_resample(three, (ImageShape){3, 1, 1}, out, (ImageShape){2, 1, 1});
    expect_row("rounded to nearest", out, (const uint8_t[]){0, 2}, 2);
    /* the same in height: a column */
    image_resample(two, (ImageShape){1, 2, 1}, out, (ImageShape){1, 4, 1});
    expect_row("upsample a column", out, (const uint8_t[]){0, 25, 75, 100}, 4);
    /* the same shape: a copy */
    const uint8_t rgb[] = {1, 2, 3, 250, 251, 252};
    image_resample(rgb, (ImageShape){2, 1, 3}, out, (ImageShape){2, 1, 3});
    expect_row("same shape", out, rgb, sizeof rgb);
    /* gray -> RGB copies; RGB -> gray: 0.299 * 255 = 76.245 -> 76, 0.587 * 255 = 149.685 -> 150 */
    image_resample(two, (ImageShape){2, 1, 1}, out, (ImageShape){2, 1, 3});
    expect_row("gray -> RGB", out, (const uint8_t[]){0, 0, 0, 100, 100, 100}, 6);
    const uint8_t red_green[] = {255, 0, 0, 0, 255, 0};
    image_resample(red_green, (ImageShape){2, 1, 3}, out, (ImageShape){2, 1, 1});
    expect_row("RGB -> gray", out, (const uint8_t[]){76, 150}, 2);
    /* both at once: 2x1 RGB -> 4x1 gray */
    const uint8_t grays[] = {0, 0, 0, 100, 100, 100};
    image_resample(grays, (ImageShape){2, 1, 3}, out, (ImageShape){4, 1, 1});
    expect_row("RGB 2 -> gray 4", out, (const uint8_t[]){0, 25, 75, 100}, 4);
    return unit_report("test_image");
}
