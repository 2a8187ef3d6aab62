"""model_pipeline: what the planner reads of a registered model."""

from absl.testing import absltest

from lingvo_pipe.core import quiet

quiet.ImportTensorFlow()

from lingvo_pipe.tools import model_pipeline  # noqa: E402
from params.mt import folder  # noqa: E402


class ModelPipelineTest(absltest.TestCase):

  def testLengthBucketsArePlannedForTheBucketHoldingTheMostTokens(self):
    pipe = model_pipeline.FromRegistry('mt.folder.TransformerTinyFolder')
    model = folder.TransformerTinyFolder()
    batches = model._Buckets()['bucket_batch_limit']  # pylint: disable=protected-access
    bounds = model.BUCKET_UPPER_BOUND
    tokens = [b * n for b, n in zip(bounds, batches)]
    i = tokens.index(max(tokens))
    self.assertEqual(pipe.batch_size, batches[i])
    m = pipe.num_micro_batches
    shapes = pipe.InputShapes(pipe.batch_size // m)
    self.assertEqual(shapes.vec.as_list(),
                     [batches[i] // m, bounds[i], model.MODEL_DIM])
    self.assertEqual(pipe.micro_batch_shapes.vec.as_list(),
                     shapes.vec.as_list())
    # Each bucket's own micro-batch shapes (the planner's bucket report).
    self.assertEqual([(b, n) for b, n, _ in pipe.buckets],
                     list(zip(bounds, batches)))
    for bound, batch, shapes in pipe.buckets:
      self.assertEqual(shapes.vec.as_list(),
                       [batch // m, bound, model.MODEL_DIM])

  def testWithoutBucketsTheTrainBatch(self):
    pipe = model_pipeline.FromRegistry('mt.synthetic.TransformerTinyGPipe')
    self.assertEqual(pipe.batch_size, 32)
    self.assertEqual(pipe.micro_batch_shapes.vec.as_list(), [8, 14, 64])
    self.assertEqual(pipe.buckets, [])


if __name__ == '__main__':
  absltest.main()
