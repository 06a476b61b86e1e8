/* Small, valid files of every data format (IDX plain and gzipped, .npy, CSV, CIFAR-10), written
 * into a directory by the harnesses that need real files to point at (not a harness itself).
 * Their names, for seeds and dictionaries:
 *   images.idx labels.idx images.idx.gz labels.idx.gz  3 images of 4x4, labels 0..2
 *   images.npy labels.npy                               uint8 [3, 4, 4], int64 [3]
 *   data.csv                                            3 rows: a label, two features
 *   cifar.bin                                           2 records */
#ifndef FUZZ_DATA_FILES_H
#define FUZZ_DATA_FILES_H

void fuzz_data_files(const char *dir);

#endif
