"""``record_video`` writes one playable MP4 per episode."""

import importlib.util

import numpy as np
import pytest
import torch

from corral.envs.video import record_video
from corral.errors import UserError


def installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # present in sys.modules as None: hidden
        return False


have_video = installed("imageio") and installed("imageio_ffmpeg")
needs_video = pytest.mark.skipif(not have_video, reason="imageio / imageio-ffmpeg not installed (pip install 'corral[video]')")


@needs_video
def test_cartpole_episodes_become_playable_mp4_files(tmp_path):
    import imageio.v2 as imageio

    seen = []

    def act(obs):
        seen.append(obs)
        return torch.ones(1, dtype=torch.long)  # push right until the pole falls

    episodes = record_video(act, "CartPole-v1", tmp_path / "videos", 2, seed=3)
    assert [e.path.name for e in episodes] == ["CartPole-v1-episode-0.mp4", "CartPole-v1-episode-1.mp4"]
    assert seen[0].shape == (1, 4) and seen[0].dtype == torch.float32
    for e in episodes:
        assert e.path.stat().st_size > 0
        assert e.episode_return == e.episode_length > 0  # CartPole: 1 per step
        reader = imageio.get_reader(str(e.path))
        frames = [f for f in reader]
        reader.close()
        assert len(frames) == e.episode_length + 1  # the first frame, then one per step
        assert frames[0].shape == (400, 600, 3) and frames[0].dtype == np.uint8
        assert frames[0].mean() > 0


@needs_video
def test_numpy_actions_from_agent_act_work_too(tmp_path):
    (episode,) = record_video(lambda obs: np.zeros((1, 1), np.float32), "Pendulum-v1", tmp_path, 1,
                              max_steps=20, name_prefix="pend")
    assert episode.path.name == "pend-episode-0.mp4" and episode.episode_length == 20


def test_an_env_that_cannot_render_rgb_arrays_is_named(tmp_path):
    from envs_for_tests import CountEnv

    with pytest.raises(UserError, match="does not take render_mode='rgb_array'"):
        record_video(lambda o: torch.zeros(1, dtype=torch.long), CountEnv, tmp_path, 1)
    with pytest.raises(UserError, match="episodes must be >= 1"):
        record_video(lambda o: o, "CartPole-v1", tmp_path, 0)


@needs_video
def test_eval_video_goes_to_tensorboard_when_asked(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import corral

    corral.train("ppo", "CartPole-v1", steps=512, seed=0, run_dir=str(tmp_path / "run"),
                 **{"eval.episodes": 2, "eval.video": True, "progress": False, "ppo.n_steps": 64})
    events = EventAccumulator(str(tmp_path / "run" / "tb"), size_guidance={"images": 0})
    events.Reload()
    assert "eval/video" in events.Tags()["images"]
    video = events.Images("eval/video")[-1]
    assert video.step == 512 and video.encoded_image_string[:6] == b"GIF89a"
    assert video.height <= 256 and video.width <= 256
